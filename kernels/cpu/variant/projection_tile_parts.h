#ifndef KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_TILE_PARTS_H_
#define KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_TILE_PARTS_H_

// What the dense and the sparse projection tiles share: their inputs as
// floats, their rows' validity, their steps (projection_steps.h, with the
// products through the BLAS), the indexer's scores and gradients from its
// dot products, and the row losses.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/projection_tile.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/cpu/variant/projection_steps.h"
#include "kernels/cpu/variant/row_convert.h"
#include "kernels/cpu/variant/row_loss.h"
#include "kernels/cpu/variant/row_passes.h"
#include "kernels/cpu/variant/row_target.h"
#include "kernels/cpu/variant/row_validity.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"
#include "kernels/row_rules.h"

namespace klserve::cpu::KLSERVE_ISA {

// The spec's bound on an lse's head mass: each head's P_h must sum to 1
// within it over a row with a valid key.
constexpr double kLseMassTolerance = 1e-3;

inline const std::byte* Bytes(const TensorView& view) {
  return static_cast<const std::byte*>(view.data);
}

// n elements of `view` from element `offset` as floats in `dst` (a copy
// even when they are FP32: gathered rows must be contiguous).
inline void CopyFloats(const TensorView& view, int64_t offset, int64_t n,
                       float* dst) {
  const std::byte* src = Bytes(view) + offset * DTypeSize(view.dtype);
  const float* f = FloatRow(view.dtype, src, n, dst);
  if (f != dst) std::memcpy(dst, f, n * sizeof(float));
}

// n elements from `offset` as floats: the bytes themselves when they are
// aligned FP32, else converted into `buffer`.
inline const float* Floats(const TensorView& view, int64_t offset, int64_t n,
                           std::vector<float>& buffer) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(n);
  return FloatRow(view.dtype, Bytes(view) + offset * DTypeSize(view.dtype), n,
                  buffer.data());
}

// The n elements of `rows` from row r's first on (a tile's rows lie
// together), as floats.
inline const float* RowFloats(const RowView& rows, int64_t r, int64_t T,
                              int64_t n, std::vector<float>& buffer) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(n);
  return FloatRow(rows.dtype, rows.Row(r, T), n, buffer.data());
}

// Whether a head's largest valid logit lies so far above its shift (the
// given lse) that the softmax's Exp (kSoftmaxHeadroom) is out of its domain.
// Its mass is then past e^72, and the tile reports the head's mass as +inf,
// which fails the mass check as any mass past 1 + kLseMassTolerance does.
inline bool MassBeyondExpDomain(float max_logit, float shift) {
  return max_logit - shift > ExpDomainTop(kSoftmaxHeadroom);
}

inline bool IsValidSlot(const RowValidity& v, int64_t s) {
  return s < v.limit && (v.bytes == nullptr || v.bytes[s] != 0);
}

// The first valid slot of x[0, n) (slot s of the row at x[s - offset])
// whose value is not finite, or -1.
inline int64_t FirstNonFiniteValid(const float* x, int64_t offset, int64_t n,
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

inline absl::Status OverflowError(const char* what, int64_t b, int64_t t,
                                  int64_t h, int64_t s, float value) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " at (b=", b, ", t=", t, h >= 0 ? absl::StrCat(", h=", h) : "",
      ", s=", s, ") is not finite in float32 (the projections overflow), got ",
      value));
}

// An indexer score of row (b, t) at key s that is not finite.
inline absl::Status IndexerScoreOverflowError(int64_t b, int64_t t, int64_t s,
                                              float value) {
  return OverflowError(
      "index_query, index_key, index_weights: the indexer score", b, t, -1, s,
      value);
}

// A given lse must leave each head of a row the mass 1 over the row's valid
// keys (dense) or slots (sparse), `over`; else it was taken over others.
inline absl::Status CheckLseMass(double mass, int64_t b, int64_t t, int64_t h,
                                 const char* over) {
  if (std::abs(mass - 1.0) <= kLseMassTolerance) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "lse: head ", h, " of row (b=", b, ", t=", t, ") gives its valid ", over,
      " a mass of ", mass, ", not 1 within ", kLseMassTolerance,
      " (the lse must be taken over the row's valid ", over,
      " in this stage)"));
}

// A head whose every valid main logit is -inf in float32 has no softmax.
inline absl::Status AllLogitsMinusInfError(int64_t b, int64_t t, int64_t h) {
  return absl::InvalidArgumentError(absl::StrCat(
      "query, key: every valid main logit of row (b=", b, ", t=", t, "), head ",
      h, " is -inf in float32 (the projections overflow)"));
}

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

// I[s] = sum_j w[j] relu(u[j, s]) for s < n (u rows `ld` apart).
inline void IndexerScores(const float* u, int64_t ld, const float* w,
                          int64_t heads, int64_t n, bool use_relu,
                          float* scores) {
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
// dw[j] += sum_s g[s] relu(u[j, s]). Slots with g = 0 add nothing to the
// sum: a masked key's u may have overflowed (it takes no part in the loss,
// and 0 * inf would be NaN), and on the other slots, where u is finite,
// their +-0 would change no bit of it.
inline void IndexerGrads(const float* u, int64_t ld, const float* w,
                         int64_t heads, int64_t n, bool use_relu,
                         const float* g, float* e, double* dw) {
  for (int64_t j = 0; j < heads; ++j) {
    const float* uj = u + j * ld;
    float* ej = e + j * ld;
    const float wj = w[j];
    float sum = 0;
    for (int64_t s = 0; s < n; ++s) {
      const bool on = !use_relu || uj[s] > 0.0f;
      ej[s] = on ? g[s] * wj : 0.0f;
      sum += on && g[s] != 0.0f ? g[s] * uj[s] : 0.0f;
    }
    dw[j] += sum;
  }
}

// Writes the tile's d_index_query and d_index_weights rows.
inline void StoreQueryGrads(const ProjectionsProblem& p,
                            const ProjectionTile& tile,
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
inline absl::Status TileRowLosses(const IndexerKlProblem& lp,
                                  const ProjectionTile& tile,
                                  const TileValidity& tv, const float* w,
                                  const float* I, float* g, RowResult* results,
                                  RowScratch& scratch, int64_t& failed_row) {
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
  return absl::OkStatus();
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
        in_(p, data, r0_, n_),
        steps_(tile.stop) {}

  // The tile's status: `computed`, unless a step said stop, whose status
  // then wins (an error found after it may come from rows left unfinished),
  // reported at the tile's first row.
  absl::Status Finish(absl::Status computed, int64_t& failed_row) const {
    if (!steps_.stopped()) return computed;
    failed_row = r0_;
    return steps_.status();
  }

 protected:
  const ProjectionsProblem& p_;
  const IndexerKlProblem& lp_;
  const ProjectionsRowData& data_;
  const ProjectionTile& tile_;
  const ProjectionTileOutputs& out_;
  const int64_t n_, r0_;
  TileInputs in_;
  TileValidity tv_;
  ProjectionSteps steps_;
};

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_TILE_PARTS_H_
