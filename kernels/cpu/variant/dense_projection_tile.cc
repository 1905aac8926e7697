// The projections form's dense tile: the main logits and the indexer scores
// of a tile of query rows against every key they may see, key tile by key
// tile through the BLAS; the row losses by the logits form's own row code;
// the gradients of the indexer's inputs.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/variant/projection_tile.h"
#include "kernels/cpu/variant/projection_tile_parts.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

// Values reused from tile to tile, grown as needed and left uninitialised
// (the large buffers of a dense tile would otherwise be zeroed and faulted
// in again for every tile).
template <typename T>
class GrowingBuffer {
 public:
  T* Get(int64_t n) {
    if (n > size_) {
      data_.reset(new T[n]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<T[]> data_;
  int64_t size_ = 0;
};
using FloatBuffer = GrowingBuffer<float>;

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

// The buffers of a dense tile, kept by each thread while it computes the
// tiles of one backend call, a chunk of a request's tiles
// (ReleaseProjectionScratch frees them after). Growing
// buffers rather than vectors made per tile: GCC may also compile a vector's
// constructor out of line, and for this variant's ISA.
struct DenseScratch {
  FloatBuffer w, I, g;       // [n, L]
  FloatBuffer e;             // one head's exponentials over one key tile
  FloatBuffer shift, scale;  // [n, H]
  // A key tile's blocks are `width` = KeyTileWidth(S) keys wide.
  KeyTileStore logits;  // the main logits, [key tile][head][n, width]
  KeyTileStore dots;    // u = q_I k_I^T, [key tile][n * H_I, width]
  GrowingBuffer<double> head_sums;  // [n, width], past 64 heads
};
thread_local std::unique_ptr<DenseScratch> dense_scratch;

// An ExpRow extra: w += scale * e on each vector of exponentials.
struct AddScaled {
  float* w;
  VecF scale;
  void operator()(int64_t i, int64_t count, VecF, VecF e) {
    StoreAt(w, i, count, Fma(scale, e, LoadAt(w, i, count, 0.0f)));
  }
};

DenseScratch& ThisThreadsScratch() {
  if (dense_scratch == nullptr)
    dense_scratch = std::make_unique<DenseScratch>();
  return *dense_scratch;
}

class DenseTile : private TileBase {
 public:
  using TileBase::Finish;
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
    steps_.GemmNT(n_, sk, p_.D, lp_.options.softmax_scale, in_.query + h * p_.D,
                  p_.H * p_.D, keys + g * p_.D, p_.H_kv * p_.D, 0.0f, logits,
                  sk);
  }

  // The row's validity within the key tile [s0, s0 + sk): the number of
  // slots below its limit, and its bytes from s0.
  int64_t TileLimit(const RowValidity& v, int64_t s0, int64_t sk) const {
    return std::clamp<int64_t>(v.limit - s0, 0, sk);
  }

  // The error for a NaN or +inf among row i's valid logits of head h in the
  // key tile at s0 (`limit` of them computed, valid where `bytes` is nonzero
  // when given).
  absl::Status LogitOverflow(int64_t i, int64_t h, int64_t s0, const float* a,
                             int64_t limit, const uint8_t* bytes) const {
    int64_t k = 0;
    while (k + 1 < limit && (a[k] < kInf || (bytes && !bytes[k]))) ++k;
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
    logits_.Reset(key_tiles, H, n_ * key_tile_width_,
                  p_.has_lse ? 0 : kStoredLogitsBytes);
    const bool stored = logits_.kept();
    const auto logits_of = [&](int64_t s0, int64_t h) {
      return logits_.At((s0 - lo_) / kKeyTile, h);
    };
    // The dot products u again in the gradients' pass.
    dots_.Reset(key_tiles, 1, n_ * p_.H_I * key_tile_width_,
                tile_.want_grad ? kStoredDotsBytes : 0);
    float* e = big_.e.Get(key_tile_width_);
    // P_h = exp(a - shift) * scale, per (i, h) at [i * H + h]: the given
    // lse and 1, or (as the logits form does) the row's max and 1 / sum.
    // The exps carry 2^kSoftmaxHeadroom, and scale takes it back out.
    float* shift = big_.shift.Get(n_ * H);
    float* scale = big_.scale.Get(n_ * H);
    std::fill(scale, scale + n_ * H,
              static_cast<float>(WithoutSoftmaxHeadroom(1.0)));
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
      float* max = shift;
      std::fill(max, max + n_ * H, -kInf);
      // Value-initialised, not (n, 0.0): GCC then inlines the constructor
      // here, where an out-of-line copy compiled for this variant could be
      // the one the whole binary calls (isa_isolation checks).
      std::vector<double> sum(n_ * H);
      for (int64_t s0 = lo_; s0 < hi_; s0 += kKeyTile) {
        const int64_t s1 = std::min(s0 + kKeyTile, hi_), sk = s1 - s0;
        const float* keys = KeyTile(s0, s1);
        for (int64_t h = 0; h < H; ++h) {
          if (!steps_.Go()) return steps_.status();
          float* logits = logits_of(s0, h);
          HeadLogits(keys, h, sk, logits);
          for (int64_t i = 0; i < n_; ++i) {
            const RowValidity& v = tv_.rows[i];
            const int64_t limit = TileLimit(v, s0, sk);
            if (v.count == 0 || limit == 0) continue;
            const float* a = logits + i * sk;
            const uint8_t* bytes = v.bytes ? v.bytes + s0 : nullptr;
            const ScanResult scan = ScanComputedLogits(a, limit, bytes);
            if (scan.any_bad) {
              failed_row = r0_ + i;
              return LogitOverflow(i, h, s0, a, limit, bytes);
            }
            if (scan.max == -kInf) continue;  // no finite valid logit here
            float& m = max[i * H + h];
            double& l = sum[i * H + h];
            if (scan.max > m) {
              // The kernels' exp of the (float) difference, not libm's:
              // glibc picks its exp by CPU at run time.
              l *= Exp(Splat(m - scan.max))[0];
              m = scan.max;
            }
            NoExtra none;
            l += bytes ? ExpRow<true, kSoftmaxHeadroom>(a, limit, bytes, m,
                                                        1.0f, e, none)
                       : ExpRow<false, kSoftmaxHeadroom>(a, limit, nullptr, m,
                                                         1.0f, e, none);
          }
        }
      }
      for (int64_t i = 0; i < n_; ++i) {
        for (int64_t h = 0; h < H; ++h) {
          if (tv_.rows[i].count > 0 && max[i * H + h] == -kInf) {
            failed_row = r0_ + i;
            return AllLogitsMinusInfError(tile_.b, tile_.t_begin + i, h);
          }
        }
      }
      for (int64_t k = 0; k < n_ * H; ++k) {
        scale[k] = static_cast<float>(1.0 / sum[k]);
      }
    }

    const bool blocked_heads = H > kHeadsPerFloatSum;
    double* head_sums =
        blocked_heads ? big_.head_sums.Get(n_ * key_tile_width_) : nullptr;
    for (int64_t s0 = lo_; s0 < hi_; s0 += kKeyTile) {
      const int64_t s1 = std::min(s0 + kKeyTile, hi_), sk = s1 - s0;
      const float* keys = stored ? nullptr : KeyTile(s0, s1);
      for (int64_t h = 0; h < H; ++h) {
        if (!steps_.Go()) return steps_.status();
        if (h % kHeadsPerFloatSum == 0 && h > 0) {  // a block of heads ended
          for (int64_t i = 0; i < n_; ++i) {
            FoldHeadBlock(w_ + i * L_ + s0, head_sums + i * key_tile_width_, sk,
                          /*first=*/h == kHeadsPerFloatSum);
          }
        }
        float* logits = logits_of(s0, h);
        if (!stored) HeadLogits(keys, h, sk, logits);
        for (int64_t i = 0; i < n_; ++i) {
          const RowValidity& v = tv_.rows[i];
          const int64_t limit = TileLimit(v, s0, sk);
          if (v.count == 0 || limit == 0) continue;
          const float* a = logits + i * sk;
          const uint8_t* bytes = v.bytes ? v.bytes + s0 : nullptr;
          const float head_shift = shift[i * H + h];
          if (p_.has_lse) {  // not yet checked: there was no first pass
            const ScanResult scan = ScanComputedLogits(a, limit, bytes);
            if (scan.any_bad) {
              failed_row = r0_ + i;
              return LogitOverflow(i, h, s0, a, limit, bytes);
            }
            if (MassBeyondExpDomain(scan.max, head_shift)) {
              mass[i * H + h] = std::numeric_limits<double>::infinity();
              continue;
            }
          }
          // w += P_h, folded into the loop of its exponentials.
          AddScaled add{w_ + i * L_ + s0, Splat(scale[i * H + h])};
          const double head_mass =
              bytes ? ExpRow<true, kSoftmaxHeadroom>(a, limit, bytes,
                                                     head_shift, 1.0f, e, add)
                    : ExpRow<false, kSoftmaxHeadroom>(a, limit, nullptr,
                                                      head_shift, 1.0f, e, add);
          if (p_.has_lse) {
            mass[i * H + h] += WithoutSoftmaxHeadroom(head_mass);
          }
        }
      }
      if (blocked_heads) {
        for (int64_t i = 0; i < n_; ++i) {
          FinishHeadSums(w_ + i * L_ + s0, head_sums + i * key_tile_width_, sk);
        }
      }
      // The indexer scores of the tile's rows: u = q_I k_I^T, rows (i, j).
      float* u = dots_.At((s0 - lo_) / kKeyTile, 0);
      steps_.GemmNT(n_ * p_.H_I, sk, p_.D_I, 1.0f, in_.index_query, p_.D_I,
                    IndexKeyTile(s0, s1), p_.D_I, 0.0f, u, sk);
      for (int64_t i = 0; i < n_; ++i) {
        const RowValidity& v = tv_.rows[i];
        float* I = I_ + i * L_ + s0;
        IndexerScores(u + i * p_.H_I * sk, sk, in_.weights.data() + i * p_.H_I,
                      p_.H_I, sk, p_.use_relu, I);
        const int64_t limit = TileLimit(v, s0, sk);
        if (const int64_t s = FirstNonFiniteValid(I, s0, limit, v); s >= 0) {
          failed_row = r0_ + i;
          return IndexerScoreOverflowError(tile_.b, tile_.t_begin + i, s,
                                           I[s - s0]);
        }
        // Slots no row may use hold 0: the row code checks every slot.
        for (int64_t k = 0; k < sk; ++k) {
          if (!IsValidSlot(v, s0 + k)) I[k] = 0.0f;
        }
      }
    }
    if (p_.has_lse) return CheckLseMasses(mass, failed_row);
    return absl::OkStatus();
  }

  absl::Status CheckLseMasses(const std::vector<double>& mass,
                              int64_t& failed_row) {
    for (int64_t i = 0; i < n_; ++i) {
      if (tv_.rows[i].count == 0) continue;
      for (int64_t h = 0; h < p_.H; ++h) {
        absl::Status s = CheckLseMass(mass[i * p_.H + h], tile_.b,
                                      tile_.t_begin + i, h, "keys");
        if (!s.ok()) {
          failed_row = r0_ + i;
          return s;
        }
      }
    }
    return absl::OkStatus();
  }

  // d_index_query, d_index_weights of the tile's rows, and its
  // contributions to d_index_key.
  void Gradients() {
    const int64_t M = n_ * p_.H_I;
    std::vector<float> dq(M * p_.D_I);  // zeros; not (M, 0.0f): see `sum`
    std::vector<double> dw(M);          // not (M, 0.0): see `sum` above
    KeyGradPartial& dk = *out_.key_grad;
    dk.count = hi_ - lo_;
    dk.rows.resize(dk.count * p_.D_I);
    dk.keys.resize(dk.count);
    for (int64_t s = lo_; s < hi_; ++s)
      dk.keys[s - lo_] = static_cast<int32_t>(s);
    std::vector<float> e(M * key_tile_width_);
    for (int64_t s0 = lo_; s0 < hi_; s0 += kKeyTile) {
      if (!steps_.Go()) return;  // Finish reports the stop
      const int64_t s1 = std::min(s0 + kKeyTile, hi_), sk = s1 - s0;
      const float* index_keys = IndexKeyTile(s0, s1);
      float* u = dots_.At((s0 - lo_) / kKeyTile, 0);
      if (!dots_.kept()) {
        steps_.GemmNT(M, sk, p_.D_I, 1.0f, in_.index_query, p_.D_I, index_keys,
                      p_.D_I, 0.0f, u, sk);
      }
      for (int64_t i = 0; i < n_; ++i) {
        IndexerGrads(u + i * p_.H_I * sk, sk, in_.weights.data() + i * p_.H_I,
                     p_.H_I, sk, p_.use_relu, g_ + i * L_ + s0,
                     e.data() + i * p_.H_I * sk, dw.data() + i * p_.H_I);
      }
      steps_.GemmNN(M, p_.D_I, sk, e.data(), sk, index_keys, p_.D_I, 1.0f,
                    dq.data(), p_.D_I);
      steps_.GemmTN(sk, p_.D_I, M, e.data(), sk, in_.index_query, p_.D_I,
                    dk.rows.data() + (s0 - lo_) * p_.D_I, p_.D_I);
    }
    // A stopped tile's sums are partial: nothing of them goes out.
    if (steps_.stopped()) return;
    StoreQueryGrads(p_, tile_, out_, dq.data(), dw.data());
  }

  int64_t lo_ = 0, hi_ = 0;
  int64_t L_ = 0;  // slots per row of w_, I_ and g_
  const int64_t key_tile_width_ = KeyTileWidth(p_.S);
  DenseScratch& big_ = ThisThreadsScratch();
  float *w_ = nullptr, *I_ = nullptr, *g_ = nullptr;  // [n, L]
  KeyTileStore& logits_ = big_.logits;
  KeyTileStore& dots_ = big_.dots;
  std::vector<float> key_buffer_, index_key_buffer_;
};

}  // namespace

absl::Status ComputeDenseProjectionTile(const ProjectionsProblem& problem,
                                        const ProjectionsRowData& data,
                                        const ProjectionTile& tile,
                                        const ProjectionTileOutputs& outputs,
                                        int64_t& failed_row) {
  DenseTile dense(problem, data, tile, outputs);
  return dense.Finish(dense.Compute(failed_row), failed_row);
}

void ReleaseProjectionScratch() { dense_scratch.reset(); }

}  // namespace klserve::cpu::KLSERVE_ISA
