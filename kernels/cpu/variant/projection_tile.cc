// The projections form's tile: the main logits and the indexer scores of a
// tile of query rows, recomputed from the projections key tile by key tile
// through the BLAS, the row losses by the logits form's own row code, and
// the gradients of the indexer's inputs.

#include "kernels/cpu/variant/projection_tile.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/row_convert.h"
#include "kernels/cpu/variant/row_loss.h"
#include "kernels/cpu/variant/row_passes.h"
#include "kernels/cpu/variant/row_target.h"
#include "kernels/cpu/variant/row_validity.h"
#include "kernels/problem.h"
#include "kernels/row_rules.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

// The spec's bound on an lse's head mass: each head's P_h must sum to 1
// within it over a row with a valid key.
constexpr double kLseMassTolerance = 1e-3;

const std::byte* Bytes(const TensorView& view) {
  return static_cast<const std::byte*>(view.data);
}

// n elements of `view` from element `offset` as floats in `dst` (a copy
// even when they are FP32: gathered rows must be contiguous).
void CopyFloats(const TensorView& view, int64_t offset, int64_t n, float* dst) {
  const std::byte* src = Bytes(view) + offset * DTypeSize(view.dtype);
  const float* f = FloatRow(view.dtype, src, n, dst);
  if (f != dst) std::memcpy(dst, f, n * sizeof(float));
}

// n elements from `offset` as floats: the bytes themselves when they are
// aligned FP32, else converted into `buffer`.
const float* Floats(const TensorView& view, int64_t offset, int64_t n,
                    std::vector<float>& buffer) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(n);
  return FloatRow(view.dtype, Bytes(view) + offset * DTypeSize(view.dtype), n,
                  buffer.data());
}

// The n elements of `rows` from row r's first on (a tile's rows lie
// together), as floats.
const float* RowFloats(const RowView& rows, int64_t r, int64_t T, int64_t n,
                       std::vector<float>& buffer) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(n);
  return FloatRow(rows.dtype, rows.Row(r, T), n, buffer.data());
}

// C[m, n] = alpha * A[m, k] B[n, k]^T (+ beta * C), row-major.
void GemmNT(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) {
  Sgemm(false, true, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
// C[m, n] = A[m, k] B[k, n] + beta * C.
void GemmNN(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Sgemm(false, false, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
// C[m, n] = A[k, m]^T B[k, n].
void GemmTN(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
            const float* b, int64_t ldb, float* c, int64_t ldc) {
  Sgemm(true, false, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

bool IsValidSlot(const RowValidity& v, int64_t s) {
  return s < v.limit && (v.bytes == nullptr || v.bytes[s] != 0);
}

// The first valid slot of x[0, n) (slot s of the row at x[s - offset])
// whose value is not finite, or -1.
int64_t FirstNonFiniteValid(const float* x, int64_t offset, int64_t n,
                            const RowValidity& v) {
  VecI bad{};
  for (int64_t i = 0; i < n; i += kLanes) {
    const VecF x_i = LoadAt(x, i, LanesAt(i, n), 0.0f);
    bad |= ~((x_i < Splat(kInf)) & (x_i > Splat(-kInf)));
  }
  if (!Any(bad)) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (IsValidSlot(v, offset + i) && !std::isfinite(x[i])) return offset + i;
  }
  return -1;
}

absl::Status OverflowError(const char* what, int64_t b, int64_t t, int64_t h,
                           int64_t s, float value) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " at (b=", b, ", t=", t, h >= 0 ? absl::StrCat(", h=", h) : "",
      ", s=", s, ") is not finite in float32 (the projections overflow), got ",
      value));
}

// Floats reused from tile to tile, grown as needed and left uninitialised
// (the large buffers of a dense tile would otherwise be zeroed and faulted
// in again for every tile).
class FloatBuffer {
 public:
  float* Get(int64_t n) {
    if (n > size_) {
      data_.reset(new float[n]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<float[]> data_;
  int64_t size_ = 0;
};

// Per key tile of a dense tile, `slices` blocks of `block` floats (a head's
// logits; the indexer's dot products): kept for all key tiles when they fit
// in `budget` bytes, so that a later pass reads them rather than computing
// them again (the same products give the same bits), else one buffer that
// each key tile overwrites.
class KeyTileStore {
 public:
  void Reset(int64_t key_tiles, int64_t slices, int64_t block, int64_t budget) {
    slices_ = slices;
    block_ = block;
    kept_ = key_tiles * slices * block * int64_t{sizeof(float)} <= budget;
    data_ = buffer_.Get(kept_ ? key_tiles * slices * block : block);
  }
  bool kept() const { return kept_; }
  float* At(int64_t key_tile, int64_t slice) {
    return data_ + (kept_ ? (key_tile * slices_ + slice) * block_ : 0);
  }

 private:
  bool kept_ = false;
  int64_t slices_ = 0, block_ = 0;
  FloatBuffer buffer_;
  float* data_ = nullptr;
};

// The large buffers of a dense tile, kept by each thread while it computes
// the tiles of one request (ReleaseProjectionScratch frees them after).
struct DenseScratch {
  FloatBuffer w, I, g;  // [n, L]
  KeyTileStore logits;  // the main logits, [key tile][head][n, kKeyTile]
  KeyTileStore dots;    // u = q_I k_I^T, [key tile][n * H_I, kKeyTile]
};
thread_local std::unique_ptr<DenseScratch> dense_scratch;

// The validity of each row of a tile, copied out of the row scratch.
struct TileValidity {
  std::vector<RowValidity> rows;
  std::vector<uint8_t> bytes;  // [rows, length]

  absl::Status Build(const IndexerKlProblem& p, const RowData& data, int64_t r0,
                     int64_t n, RowScratch& scratch, int64_t& failed_row) {
    rows.resize(n);
    bytes.resize(n * p.row_length);
    for (int64_t i = 0; i < n; ++i) {
      absl::StatusOr<RowValidity> v =
          BuildRowValidity(p, data, r0 + i, scratch);
      if (!v.ok()) {
        failed_row = r0 + i;
        return v.status();
      }
      rows[i] = *v;
      if (v->bytes != nullptr) {
        std::memcpy(bytes.data() + i * p.row_length, v->bytes, v->limit);
        rows[i].bytes = bytes.data() + i * p.row_length;
      }
    }
    return absl::OkStatus();
  }
};

// The tile's rows of the projections that every stage reads, as floats.
struct TileInputs {
  const float* query = nullptr;        // [n, H, D]
  const float* index_query = nullptr;  // [n, H_I, D_I]
  std::vector<float> weights;          // w_eff [n, H_I]
  std::vector<float> query_buffer, index_query_buffer, weights_buffer;

  TileInputs(const ProjectionsProblem& p, const ProjectionsRowData& data,
             int64_t r0, int64_t n) {
    query = RowFloats(data.query, r0, p.T, n * p.H * p.D, query_buffer);
    index_query = RowFloats(data.index_query, r0, p.T, n * p.H_I * p.D_I,
                            index_query_buffer);
    const float* w =
        RowFloats(data.index_weights, r0, p.T, n * p.H_I, weights_buffer);
    weights.resize(n * p.H_I);
    for (int64_t i = 0; i < n * p.H_I; ++i) {
      weights[i] = w[i] * p.index_weight_scale;
    }
  }
};

// An ExpRow extra: w += scale * e on each vector of exponentials.
struct AddScaled {
  float* w;
  float scale;
  void operator()(int64_t i, int64_t count, VecF, VecF e) {
    StoreAt(w, i, count, Fma(Splat(scale), e, LoadAt(w, i, count, 0.0f)));
  }
};

// I[s] = sum_j w[j] relu(u[j, s]) for s < n (u rows `ld` apart).
void IndexerScores(const float* u, int64_t ld, const float* w, int64_t heads,
                   int64_t n, bool use_relu, float* scores) {
  std::fill(scores, scores + n, 0.0f);
  for (int64_t j = 0; j < heads; ++j) {
    const float* uj = u + j * ld;
    const float wj = w[j];
    if (use_relu) {
      for (int64_t s = 0; s < n; ++s) scores[s] += wj * std::max(uj[s], 0.0f);
    } else {
      for (int64_t s = 0; s < n; ++s) scores[s] += wj * uj[s];
    }
  }
}

// From the row gradient g (dL/dI, n slots) and u: e[j, s] = g[s] w[j]
// relu'(u[j, s]) into `e` (rows `ld` apart), and
// dw[j] += sum_s g[s] relu(u[j, s]).
void IndexerGrads(const float* u, int64_t ld, const float* w, int64_t heads,
                  int64_t n, bool use_relu, const float* g, float* e,
                  double* dw) {
  for (int64_t j = 0; j < heads; ++j) {
    const float* uj = u + j * ld;
    float* ej = e + j * ld;
    const float wj = w[j];
    float sum = 0;
    if (use_relu) {
      for (int64_t s = 0; s < n; ++s) {
        const bool on = uj[s] > 0.0f;
        ej[s] = on ? g[s] * wj : 0.0f;
        sum += on ? g[s] * uj[s] : 0.0f;
      }
    } else {
      for (int64_t s = 0; s < n; ++s) {
        ej[s] = g[s] * wj;
        sum += g[s] * uj[s];
      }
    }
    dw[j] += sum;
  }
}

// Writes the tile's d_index_query and d_index_weights rows.
void StoreQueryGrads(const ProjectionsProblem& p, const ProjectionTile& tile,
                     const ProjectionTileOutputs& out, const float* dq,
                     const double* dw) {
  const int64_t n = tile.t_end - tile.t_begin;
  const int64_t r0 = tile.b * p.T + tile.t_begin - out.origin_row;
  const int64_t size = DTypeSize(out.grad_dtype);
  StoreFloatRow(dq, n * p.H_I * p.D_I, out.grad_dtype,
                out.d_index_query + r0 * p.H_I * p.D_I * size);
  std::vector<float> dw_out(n * p.H_I);
  for (int64_t i = 0; i < n * p.H_I; ++i) {
    dw_out[i] = static_cast<float>(dw[i] * p.index_weight_scale);
  }
  StoreFloatRow(dw_out.data(), n * p.H_I, out.grad_dtype,
                out.d_index_weights + r0 * p.H_I * size);
}

// The row loss of each row of a tile from its target w and scores I
// ([n, length] each), writing g = grad_scale * dKL/dI for rows that count.
absl::Status TileRowLosses(const IndexerKlProblem& lp,
                           const ProjectionTile& tile, const TileValidity& tv,
                           const float* w, const float* I, float* g,
                           RowResult* results, RowScratch& scratch,
                           int64_t& failed_row) {
  const int64_t n = tile.t_end - tile.t_begin;
  const int64_t L = lp.row_length;
  const RowTarget target_of_rows{
      .z = TargetNormaliser(static_cast<double>(lp.H),
                            lp.options.flavor == Flavor::kMaxText)};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = tile.b * lp.T + tile.t_begin + i;
    RowTarget target = target_of_rows;
    target.w = w + i * L;
    const bool counts = lp.row_counts(r);
    float* row_g = tile.want_grad && counts ? g + i * L : nullptr;
    absl::StatusOr<RowResult> result = ComputeRowLossFromTarget(
        lp, r, tv.rows[i], target, I + i * L,
        static_cast<float>(tile.grad_scale), row_g, scratch);
    if (!result.ok()) {
      failed_row = r;
      return result.status();
    }
    results[i] = *result;
    if (tile.want_grad && !counts) std::fill(g + i * L, g + (i + 1) * L, 0.0f);
  }
  FinishStreamingStores();  // g is read back at once
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The dense stage: every valid key of each row, in key tiles.

DenseScratch& ThisThreadsScratch() {
  if (dense_scratch == nullptr)
    dense_scratch = std::make_unique<DenseScratch>();
  return *dense_scratch;
}

// What a dense and a sparse tile both start from: the problem, the tile,
// its rows' inputs as floats, their validity.
class TileBase {
 public:
  TileBase(const ProjectionsProblem& p, const ProjectionsRowData& data,
           const ProjectionTile& tile, const ProjectionTileOutputs& out)
      : p_(p),
        lp_(p.logits),
        data_(data),
        tile_(tile),
        out_(out),
        n_(tile.t_end - tile.t_begin),
        r0_(tile.b * p.T + tile.t_begin),
        in_(p, data, r0_, n_) {}

 protected:
  const ProjectionsProblem& p_;
  const IndexerKlProblem& lp_;
  const ProjectionsRowData& data_;
  const ProjectionTile& tile_;
  const ProjectionTileOutputs& out_;
  const int64_t n_, r0_;
  TileInputs in_;
  TileValidity tv_;
};

class DenseTile : private TileBase {
 public:
  using TileBase::TileBase;

  absl::Status Compute(int64_t& failed_row) {
    RowScratch& scratch = RowScratch::ForThisThread(lp_);
    RowData data;
    data.mask = data_.mask;
    if (absl::Status s = tv_.Build(lp_, data, r0_, n_, scratch, failed_row);
        !s.ok()) {
      return s;
    }
    KeyRange();
    // The rows end at hi_, past which no row of the tile has a valid key:
    // the row code then passes over L = hi_ slots a row, not S.
    IndexerKlProblem rows = lp_;
    rows.row_length = L_ = std::max<int64_t>(hi_, 1);
    // w accumulates; the scores are written on [lo_, hi_) and must be finite
    // (0) elsewhere; the row code writes every slot of g.
    w_ = big_.w.Get(n_ * L_);
    I_ = big_.I.Get(n_ * L_);
    std::fill(w_, w_ + n_ * L_, 0.0f);
    for (int64_t i = 0; i < n_; ++i) {
      std::fill(I_ + i * L_, I_ + i * L_ + lo_, 0.0f);
      std::fill(I_ + i * L_ + hi_, I_ + (i + 1) * L_, 0.0f);  // hi_ = 0
    }
    if (absl::Status s = TargetAndScores(failed_row); !s.ok()) return s;
    if (tile_.want_grad) g_ = big_.g.Get(n_ * L_);
    if (absl::Status s = TileRowLosses(rows, tile_, tv_, w_, I_, g_,
                                       out_.results, scratch, failed_row);
        !s.ok()) {
      return s;
    }
    if (tile_.want_grad) Gradients();
    return absl::OkStatus();
  }

 private:
  // [lo_, hi_): the keys any row of the tile may see.
  void KeyRange() {
    lo_ = p_.S;
    hi_ = 0;
    for (const RowValidity& v : tv_.rows) {
      if (v.count == 0) continue;
      int64_t first = 0;
      if (v.bytes != nullptr) {
        while (v.bytes[first] == 0) ++first;
      }
      lo_ = std::min(lo_, first);
      hi_ = std::max(hi_, v.limit);
    }
    if (hi_ <= lo_) lo_ = hi_ = 0;
  }

  // The keys [s0, s1) of the main attention (all key heads) as floats.
  const float* KeyTile(int64_t s0, int64_t s1) {
    const int64_t width = p_.H_kv * p_.D;
    return Floats(p_.key, (tile_.b * p_.S + s0) * width, (s1 - s0) * width,
                  key_buffer_);
  }
  const float* IndexKeyTile(int64_t s0, int64_t s1) {
    return Floats(p_.index_key, (tile_.b * p_.S + s0) * p_.D_I,
                  (s1 - s0) * p_.D_I, index_key_buffer_);
  }

  // logits[i, k] = scale * query[i, h] . key[s0 + k, h's key head].
  void HeadLogits(const float* keys, int64_t h, int64_t sk, float* logits) {
    const int64_t g = h / (p_.H / p_.H_kv);
    GemmNT(n_, sk, p_.D, lp_.options.softmax_scale, in_.query + h * p_.D,
           p_.H * p_.D, keys + g * p_.D, p_.H_kv * p_.D, 0.0f, logits, sk);
  }

  // The row's validity within the key tile [s0, s0 + sk): the number of
  // slots below its limit, and its bytes from s0.
  int64_t TileLimit(const RowValidity& v, int64_t s0, int64_t sk) const {
    return std::clamp<int64_t>(v.limit - s0, 0, sk);
  }

  // The error for a NaN or +inf among row i's logits of head h in the key
  // tile at s0 (`limit` of them computed).
  absl::Status LogitOverflow(int64_t i, int64_t h, int64_t s0, const float* a,
                             int64_t limit) const {
    int64_t k = 0;
    while (k + 1 < limit && a[k] < kInf) ++k;
    return OverflowError("query, key: the main logit", tile_.b,
                         tile_.t_begin + i, h, s0 + k, a[k]);
  }

  // Each head's log-sum-exp over each row's valid keys (given, or by an
  // online pass over the key tiles), then the target w = sum_h P_h and the
  // scores I, key tile by key tile.
  absl::Status TargetAndScores(int64_t& failed_row) {
    const int64_t H = p_.H;
    // Without an lse the logits are needed twice (each head's maximum and
    // sum first, then its P_h). When the tile's logits fit in
    // kStoredLogitsBytes the first pass keeps them; otherwise the second
    // recomputes them, the same products giving the same bits.
    const int64_t key_tiles = (hi_ - lo_ + kKeyTile - 1) / kKeyTile;
    logits_.Reset(key_tiles, H, n_ * kKeyTile,
                  p_.has_lse ? 0 : kStoredLogitsBytes);
    const bool stored = logits_.kept();
    const auto logits_of = [&](int64_t s0, int64_t h) {
      return logits_.At((s0 - lo_) / kKeyTile, h);
    };
    // The dot products u again in the gradients' pass.
    dots_.Reset(key_tiles, 1, n_ * p_.H_I * kKeyTile,
                tile_.want_grad ? kStoredDotsBytes : 0);
    std::vector<float> e(kKeyTile);
    // P_h = exp(a - shift) * scale, per (i, h) at [i * H + h]: the given
    // lse and 1, or (as the logits form does) the row's max and 1 / sum.
    std::vector<float> shift(n_ * H), scale(n_ * H, 1.0f);
    // With the given lse, each head's mass, checked against 1.
    std::vector<double> mass;
    if (p_.has_lse) {
      mass.assign(n_ * H, 0.0);
      for (int64_t i = 0; i < n_; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          std::memcpy(&shift[i * H + h], data_.lse.Row(r0_ + i, p_.T, h),
                      sizeof(float));
        }
      }
    } else {
      std::vector<float>& max = shift;
      std::fill(max.begin(), max.end(), -kInf);
      std::vector<double> sum(n_ * H, 0.0);
      for (int64_t s0 = lo_; s0 < hi_; s0 += kKeyTile) {
        const int64_t s1 = std::min(s0 + kKeyTile, hi_), sk = s1 - s0;
        const float* keys = KeyTile(s0, s1);
        for (int64_t h = 0; h < H; ++h) {
          float* logits = logits_of(s0, h);
          HeadLogits(keys, h, sk, logits);
          for (int64_t i = 0; i < n_; ++i) {
            const RowValidity& v = tv_.rows[i];
            const int64_t limit = TileLimit(v, s0, sk);
            if (v.count == 0 || limit == 0) continue;
            const float* a = logits + i * sk;
            const uint8_t* bytes = v.bytes ? v.bytes + s0 : nullptr;
            const ScanResult scan =
                bytes ? ScanLogits<true>(a, limit, limit, bytes)
                      : ScanLogits<false>(a, limit, limit, nullptr);
            if (scan.any_bad) {
              failed_row = r0_ + i;
              return LogitOverflow(i, h, s0, a, limit);
            }
            if (scan.max == -kInf) continue;  // no finite valid logit here
            float& m = max[i * H + h];
            double& l = sum[i * H + h];
            if (scan.max > m) {
              l *= std::exp(static_cast<double>(m) - scan.max);
              m = scan.max;
            }
            l += bytes ? ExpRow<true>(a, limit, bytes, m, 1.0f, e.data(),
                                      NoExtra())
                       : ExpRow<false>(a, limit, nullptr, m, 1.0f, e.data(),
                                       NoExtra());
          }
        }
      }
      for (int64_t i = 0; i < n_; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          if (tv_.rows[i].count > 0 && max[i * H + h] == -kInf) {
            failed_row = r0_ + i;
            return absl::InvalidArgumentError(absl::StrCat(
                "query, key: every valid main logit of row (b=", tile_.b,
                ", t=", tile_.t_begin + i, "), head ", h,
                " is -inf in float32 (the projections overflow)"));
          }
        }
      }
      for (int64_t k = 0; k < n_ * H; ++k) {
        scale[k] = static_cast<float>(1.0 / sum[k]);
      }
    }

    for (int64_t s0 = lo_; s0 < hi_; s0 += kKeyTile) {
      const int64_t s1 = std::min(s0 + kKeyTile, hi_), sk = s1 - s0;
      const float* keys = stored ? nullptr : KeyTile(s0, s1);
      for (int64_t h = 0; h < H; ++h) {
        float* logits = logits_of(s0, h);
        if (!stored) HeadLogits(keys, h, sk, logits);
        for (int64_t i = 0; i < n_; ++i) {
          const RowValidity& v = tv_.rows[i];
          const int64_t limit = TileLimit(v, s0, sk);
          if (v.count == 0 || limit == 0) continue;
          const float* a = logits + i * sk;
          const uint8_t* bytes = v.bytes ? v.bytes + s0 : nullptr;
          if (p_.has_lse) {  // not yet checked: there was no first pass
            const ScanResult scan =
                bytes ? ScanLogits<true>(a, limit, limit, bytes)
                      : ScanLogits<false>(a, limit, limit, nullptr);
            if (scan.any_bad) {
              failed_row = r0_ + i;
              return LogitOverflow(i, h, s0, a, limit);
            }
          }
          // w += P_h, folded into the loop of its exponentials.
          AddScaled add{w_ + i * L_ + s0, scale[i * H + h]};
          const float head_shift = shift[i * H + h];
          const double head_mass =
              bytes ? ExpRow<true>(a, limit, bytes, head_shift, 1.0f, e.data(),
                                   add)
                    : ExpRow<false>(a, limit, nullptr, head_shift, 1.0f,
                                    e.data(), add);
          if (p_.has_lse) mass[i * H + h] += head_mass;
        }
      }
      // The indexer scores of the tile's rows: u = q_I k_I^T, rows (i, j).
      float* u = dots_.At((s0 - lo_) / kKeyTile, 0);
      GemmNT(n_ * p_.H_I, sk, p_.D_I, 1.0f, in_.index_query, p_.D_I,
             IndexKeyTile(s0, s1), p_.D_I, 0.0f, u, sk);
      for (int64_t i = 0; i < n_; ++i) {
        const RowValidity& v = tv_.rows[i];
        float* I = I_ + i * L_ + s0;
        IndexerScores(u + i * p_.H_I * sk, sk, in_.weights.data() + i * p_.H_I,
                      p_.H_I, sk, p_.use_relu, I);
        const int64_t limit = TileLimit(v, s0, sk);
        if (const int64_t s = FirstNonFiniteValid(I, s0, limit, v); s >= 0) {
          failed_row = r0_ + i;
          return OverflowError(
              "index_query, index_key, index_weights: the indexer score",
              tile_.b, tile_.t_begin + i, -1, s, I[s - s0]);
        }
        // Slots no row may use hold 0: the row code checks every slot.
        for (int64_t k = 0; k < sk; ++k) {
          if (!IsValidSlot(v, s0 + k)) I[k] = 0.0f;
        }
      }
    }
    if (p_.has_lse) return CheckLseMass(mass, failed_row);
    return absl::OkStatus();
  }

  absl::Status CheckLseMass(const std::vector<double>& mass,
                            int64_t& failed_row) {
    for (int64_t i = 0; i < n_; ++i) {
      if (tv_.rows[i].count == 0) continue;
      for (int64_t h = 0; h < p_.H; ++h) {
        const double m = mass[i * p_.H + h];
        if (!(std::abs(m - 1.0) <= kLseMassTolerance)) {
          failed_row = r0_ + i;
          return absl::InvalidArgumentError(absl::StrCat(
              "lse: head ", h, " of row (b=", tile_.b,
              ", t=", tile_.t_begin + i, ") gives its valid keys a mass of ", m,
              ", not 1 within ", kLseMassTolerance,
              " (the lse must be taken over the row's valid keys in this "
              "stage)"));
        }
      }
    }
    return absl::OkStatus();
  }

  // d_index_query, d_index_weights of the tile's rows, and its
  // contributions to d_index_key.
  void Gradients() {
    const int64_t M = n_ * p_.H_I;
    std::vector<float> dq(M * p_.D_I, 0.0f);
    std::vector<double> dw(M, 0.0);
    KeyGradPartial& dk = *out_.key_grad;
    dk.count = hi_ - lo_;
    dk.rows.resize(dk.count * p_.D_I);
    dk.keys.resize(dk.count);
    for (int64_t s = lo_; s < hi_; ++s)
      dk.keys[s - lo_] = static_cast<int32_t>(s);
    std::vector<float> e(M * kKeyTile);
    for (int64_t s0 = lo_; s0 < hi_; s0 += kKeyTile) {
      const int64_t s1 = std::min(s0 + kKeyTile, hi_), sk = s1 - s0;
      const float* index_keys = IndexKeyTile(s0, s1);
      float* u = dots_.At((s0 - lo_) / kKeyTile, 0);
      if (!dots_.kept()) {
        GemmNT(M, sk, p_.D_I, 1.0f, in_.index_query, p_.D_I, index_keys, p_.D_I,
               0.0f, u, sk);
      }
      for (int64_t i = 0; i < n_; ++i) {
        IndexerGrads(u + i * p_.H_I * sk, sk, in_.weights.data() + i * p_.H_I,
                     p_.H_I, sk, p_.use_relu, g_ + i * L_ + s0,
                     e.data() + i * p_.H_I * sk, dw.data() + i * p_.H_I);
      }
      GemmNN(M, p_.D_I, sk, e.data(), sk, index_keys, p_.D_I, 1.0f, dq.data(),
             p_.D_I);
      GemmTN(sk, p_.D_I, M, e.data(), sk, in_.index_query, p_.D_I,
             dk.rows.data() + (s0 - lo_) * p_.D_I, p_.D_I);
    }
    StoreQueryGrads(p_, tile_, out_, dq.data(), dw.data());
  }

  int64_t lo_ = 0, hi_ = 0;
  int64_t L_ = 0;  // slots per row of w_, I_ and g_
  DenseScratch& big_ = ThisThreadsScratch();
  float *w_ = nullptr, *I_ = nullptr, *g_ = nullptr;  // [n, L]
  KeyTileStore& logits_ = big_.logits;
  KeyTileStore& dots_ = big_.dots;
  std::vector<float> key_buffer_, index_key_buffer_;
};

// ---------------------------------------------------------------------------
// The sparse stage: each row's K slots, the keys gathered row by row.

// The service's selection for the tile's rows into `indices` ([n, K]): the
// K valid keys with the highest scores, ties to the lower key, in ascending
// key order, then -1.
absl::Status SelectTopk(const ProjectionsProblem& p,
                        const ProjectionsRowData& rows,
                        const ProjectionTile& tile, const TileInputs& in,
                        int32_t* indices, RowScratch& scratch,
                        int64_t& failed_row) {
  const IndexerKlProblem& dense = *p.selection;
  const int64_t n = tile.t_end - tile.t_begin;
  const int64_t r0 = tile.b * p.T + tile.t_begin;
  RowData data;
  data.mask = rows.mask;
  TileValidity tv;
  if (absl::Status s = tv.Build(dense, data, r0, n, scratch, failed_row);
      !s.ok()) {
    return s;
  }
  int64_t hi = 0;
  for (const RowValidity& v : tv.rows) hi = std::max(hi, v.limit);
  std::vector<float> scores(n * p.S, 0.0f), u(n * p.H_I * kKeyTile);
  std::vector<float> index_key_buffer;
  for (int64_t s0 = 0; s0 < hi; s0 += kKeyTile) {
    const int64_t s1 = std::min(s0 + kKeyTile, hi), sk = s1 - s0;
    GemmNT(n * p.H_I, sk, p.D_I, 1.0f, in.index_query, p.D_I,
           Floats(p.index_key, (tile.b * p.S + s0) * p.D_I, sk * p.D_I,
                  index_key_buffer),
           p.D_I, 0.0f, u.data(), sk);
    for (int64_t i = 0; i < n; ++i) {
      IndexerScores(u.data() + i * p.H_I * sk, sk,
                    in.weights.data() + i * p.H_I, p.H_I, sk, p.use_relu,
                    scores.data() + i * p.S + s0);
    }
  }
  std::vector<std::pair<float, int32_t>> ranked;
  for (int64_t i = 0; i < n; ++i) {
    const RowValidity& v = tv.rows[i];
    const float* I = scores.data() + i * p.S;
    ranked.clear();
    for (int64_t s = 0; s < v.limit; ++s) {
      if (!IsValidSlot(v, s)) continue;
      if (!std::isfinite(I[s])) {
        failed_row = r0 + i;
        return OverflowError(
            "index_query, index_key, index_weights: the indexer score", tile.b,
            tile.t_begin + i, -1, s, I[s]);
      }
      ranked.emplace_back(I[s], static_cast<int32_t>(s));
    }
    const int64_t k = std::min<int64_t>(p.K, ranked.size());
    const auto higher = [](const std::pair<float, int32_t>& a,
                           const std::pair<float, int32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::nth_element(ranked.begin(), ranked.begin() + k, ranked.end(), higher);
    int32_t* row = indices + i * p.K;
    for (int64_t j = 0; j < k; ++j) row[j] = ranked[j].second;
    // A comparator of this namespace's own: the sort is then instantiated
    // inside the variant, never as a library function that another
    // variant's copy could stand in for (scripts/check_isa_isolation.py).
    std::sort(row, row + k, [](int32_t a, int32_t b) { return a < b; });
    std::fill(row + k, row + p.K, -1);
  }
  return absl::OkStatus();
}

class SparseTile : private TileBase {
 public:
  using TileBase::TileBase;

  absl::Status Compute(int64_t& failed_row) {
    RowData data;
    std::vector<int32_t> selected;
    if (p_.server_topk) {
      selected.resize(n_ * p_.K);
      RowScratch& wide = RowScratch::ForThisThread(*p_.selection);
      if (absl::Status s = SelectTopk(p_, data_, tile_, in_, selected.data(),
                                      wide, failed_row);
          !s.ok()) {
        return s;
      }
      if (out_.topk_indices != nullptr) {
        std::copy(selected.begin(), selected.end(),
                  out_.topk_indices + (r0_ - out_.origin_row) * p_.K);
      }
      data.indices =
          RowView{.dtype = DType::kInt32,
                  .data = reinterpret_cast<const std::byte*>(selected.data()),
                  .origin_row = r0_,
                  .batch_stride = p_.T * p_.K,
                  .row_stride = p_.K};
    } else {
      data.indices = data_.indices;
    }
    data.mask = data_.mask;
    RowScratch& rows = RowScratch::ForThisThread(lp_);
    if (absl::Status s = tv_.Build(lp_, data, r0_, n_, rows, failed_row);
        !s.ok()) {
      return s;
    }
    const int64_t K = p_.K;
    keys_.resize(n_ * K);
    w_.assign(n_ * K, 0.0f);
    I_.assign(n_ * K, 0.0f);
    u_.resize(n_ * p_.H_I * K);
    gathered_index_keys_.resize(n_ * K * p_.D_I);
    for (int64_t i = 0; i < n_; ++i) {
      if (absl::Status s = RowTargetAndScores(i, data, failed_row); !s.ok()) {
        return s;
      }
    }
    if (tile_.want_grad) g_.assign(n_ * K, 0.0f);
    if (absl::Status s =
            TileRowLosses(lp_, tile_, tv_, w_.data(), I_.data(), g_.data(),
                          out_.results, rows, failed_row);
        !s.ok()) {
      return s;
    }
    if (tile_.want_grad) Gradients();
    return absl::OkStatus();
  }

 private:
  // Row i's valid slots' keys (compact, in slot order) into keys_, their
  // number into count_[i]; w and I of its slots.
  absl::Status RowTargetAndScores(int64_t i, const RowData& data,
                                  int64_t& failed_row) {
    const int64_t K = p_.K;
    const RowValidity& v = tv_.rows[i];
    const int64_t r = r0_ + i;
    const std::byte* indices = data.indices.Row(r, p_.T);
    int32_t* keys = keys_.data() + i * K;
    int64_t nv = 0;
    for (int64_t j = 0; j < K; ++j) {
      if (IsValidSlot(v, j)) {
        std::memcpy(&keys[nv++], indices + 4 * j, sizeof(int32_t));
      }
    }
    counts_.push_back(nv);
    if (nv == 0) return absl::OkStatus();
    const int64_t gs = p_.H / p_.H_kv;
    const int64_t t = tile_.t_begin + i;
    std::vector<float>& gathered = gather_buffer_;
    gathered.resize(nv * p_.D);
    std::vector<float>& logits = logits_buffer_;
    logits.resize(gs * nv);
    std::vector<float>& head_w = head_w_buffer_;
    head_w.assign(nv, 0.0f);
    for (int64_t g = 0; g < p_.H_kv; ++g) {
      for (int64_t x = 0; x < nv; ++x) {
        CopyFloats(p_.key, ((tile_.b * p_.S + keys[x]) * p_.H_kv + g) * p_.D,
                   p_.D, gathered.data() + x * p_.D);
      }
      GemmNT(gs, nv, p_.D, lp_.options.softmax_scale,
             in_.query + (i * p_.H + g * gs) * p_.D, p_.D, gathered.data(),
             p_.D, 0.0f, logits.data(), nv);
      for (int64_t y = 0; y < gs; ++y) {
        const int64_t h = g * gs + y;
        float* a = logits.data() + y * nv;
        float m = -kInf;
        for (int64_t x = 0; x < nv; ++x) {
          if (!std::isfinite(a[x])) {
            failed_row = r;
            return OverflowError("query, key: the main logit", tile_.b, t, h,
                                 keys[x], a[x]);
          }
          m = std::max(m, a[x]);
        }
        float shift = m;
        double mass = 0;
        if (p_.has_lse) {
          std::memcpy(&shift, data_.lse.Row(r, p_.T, h), sizeof(float));
        }
        for (int64_t x = 0; x < nv; ++x) {
          a[x] = std::exp(a[x] - shift);
          mass += a[x];
        }
        if (p_.has_lse && !(std::abs(mass - 1.0) <= kLseMassTolerance)) {
          failed_row = r;
          return absl::InvalidArgumentError(absl::StrCat(
              "lse: head ", h, " of row (b=", tile_.b, ", t=", t,
              ") gives its valid slots a mass of ", mass, ", not 1 within ",
              kLseMassTolerance,
              " (the lse must be taken over the row's valid slots)"));
        }
        const float inv = p_.has_lse ? 1.0f : static_cast<float>(1.0 / mass);
        for (int64_t x = 0; x < nv; ++x) head_w[x] += a[x] * inv;
      }
    }
    float* index_keys = gathered_index_keys_.data() + i * K * p_.D_I;
    for (int64_t x = 0; x < nv; ++x) {
      CopyFloats(p_.index_key, (tile_.b * p_.S + keys[x]) * p_.D_I, p_.D_I,
                 index_keys + x * p_.D_I);
    }
    float* u = u_.data() + i * p_.H_I * K;
    GemmNT(p_.H_I, nv, p_.D_I, 1.0f, in_.index_query + i * p_.H_I * p_.D_I,
           p_.D_I, index_keys, p_.D_I, 0.0f, u, nv);
    std::vector<float>& scores = scores_buffer_;
    scores.resize(nv);
    IndexerScores(u, nv, in_.weights.data() + i * p_.H_I, p_.H_I, nv,
                  p_.use_relu, scores.data());
    // Back to the row's slots.
    float* w = w_.data() + i * K;
    float* I = I_.data() + i * K;
    for (int64_t j = 0, x = 0; j < K; ++j) {
      if (!IsValidSlot(v, j)) continue;
      if (!std::isfinite(scores[x])) {
        failed_row = r;
        return OverflowError(
            "index_query, index_key, index_weights: the indexer score", tile_.b,
            t, -1, keys[x], scores[x]);
      }
      w[j] = head_w[x];
      I[j] = scores[x];
      ++x;
    }
    return absl::OkStatus();
  }

  void Gradients() {
    const int64_t K = p_.K;
    std::vector<float> dq(n_ * p_.H_I * p_.D_I, 0.0f);
    std::vector<double> dw(n_ * p_.H_I, 0.0);
    KeyGradPartial& dk = *out_.key_grad;
    int64_t total = 0;
    for (int64_t c : counts_) total += c;
    dk.count = total;
    dk.rows.resize(total * p_.D_I);
    dk.keys.resize(total);
    std::vector<float> g(K), e(p_.H_I * K);
    int64_t at = 0;
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t nv = counts_[i];
      if (nv == 0) continue;
      const RowValidity& v = tv_.rows[i];
      const float* row_g = g_.data() + i * K;
      for (int64_t j = 0, x = 0; j < K; ++j) {
        if (IsValidSlot(v, j)) g[x++] = row_g[j];
      }
      const float* u = u_.data() + i * p_.H_I * K;
      IndexerGrads(u, nv, in_.weights.data() + i * p_.H_I, p_.H_I, nv,
                   p_.use_relu, g.data(), e.data(), dw.data() + i * p_.H_I);
      const float* index_keys = gathered_index_keys_.data() + i * K * p_.D_I;
      GemmNN(p_.H_I, p_.D_I, nv, e.data(), nv, index_keys, p_.D_I, 0.0f,
             dq.data() + i * p_.H_I * p_.D_I, p_.D_I);
      GemmTN(nv, p_.D_I, p_.H_I, e.data(), nv,
             in_.index_query + i * p_.H_I * p_.D_I, p_.D_I,
             dk.rows.data() + at * p_.D_I, p_.D_I);
      std::copy(keys_.data() + i * K, keys_.data() + i * K + nv,
                dk.keys.data() + at);
      at += nv;
    }
    StoreQueryGrads(p_, tile_, out_, dq.data(), dw.data());
  }

  std::vector<int32_t> keys_;     // [n, K]: each row's valid slots' keys
  std::vector<int64_t> counts_;   // valid slots per row
  std::vector<float> w_, I_, g_;  // [n, K]
  std::vector<float> u_;          // [n, H_I, K] (row i: [H_I, count])
  std::vector<float> gathered_index_keys_;  // [n, K, D_I]
  // One row's buffers, reused by every row.
  std::vector<float> gather_buffer_, logits_buffer_, head_w_buffer_,
      scores_buffer_;
};

}  // namespace

void ReleaseProjectionScratch() { dense_scratch.reset(); }

absl::Status CountRowsWithKeys(const ProjectionsProblem& problem,
                               const ProjectionsRowData& rows_data,
                               RowRange rows, int64_t& count,
                               int64_t& failed_row) {
  // With the service's selection a row has a valid slot iff it has a valid
  // key; with the client's indices, its slots decide (and are checked).
  const IndexerKlProblem& p =
      problem.server_topk ? *problem.selection : problem.logits;
  RowData data;
  data.mask = rows_data.mask;
  data.indices = rows_data.indices;
  RowScratch& scratch = RowScratch::ForThisThread(p);
  count = 0;
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    absl::StatusOr<RowValidity> v = BuildRowValidity(p, data, r, scratch);
    if (!v.ok()) {
      failed_row = r;
      return v.status();
    }
    count += v->count > 0;
  }
  return absl::OkStatus();
}

absl::Status ComputeProjectionTile(const ProjectionsProblem& problem,
                                   const ProjectionsRowData& data,
                                   const ProjectionTile& tile,
                                   const ProjectionTileOutputs& outputs,
                                   int64_t& failed_row) {
  if (problem.sparse()) {
    return SparseTile(problem, data, tile, outputs).Compute(failed_row);
  }
  return DenseTile(problem, data, tile, outputs).Compute(failed_row);
}

}  // namespace klserve::cpu::KLSERVE_ISA
