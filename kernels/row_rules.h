#ifndef KLSERVE_KERNELS_ROW_RULES_H_
#define KLSERVE_KERNELS_ROW_RULES_H_

// The rules of one row that every backend applies alike, stated once: the
// CPU backend, the CUDA backend's host code and its row kernel all include
// this header. So it is plain C++17 (nvcc compiles the row kernel as C++17)
// with no library beyond <cmath>, and every function is usable from host and
// device code.

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KLSERVE_HOST_DEVICE __host__ __device__
#else
#define KLSERVE_HOST_DEVICE
#endif

namespace klserve {

// MAXTEXT's epsilon (docs/spec.md): added to the target's normaliser, and to
// p and q inside its logarithms and its gradient.
inline constexpr float kMaxTextEpsilon = 1e-8f;

// The target's normaliser Z from its mass: H for per-head logits, the sum of
// the valid weights for head-aggregated ones; MAXTEXT adds its epsilon.
KLSERVE_HOST_DEVICE inline double TargetNormaliser(double mass, bool maxtext) {
  return maxtext ? mass + static_cast<double>(kMaxTextEpsilon) : mass;
}

// The backends form p = w / Z in float as w * (1 / Z); far from 1, 1 / Z
// would overflow or lose bits in float. When Z lies outside [2^-100, 2^100]
// the weights and Z are scaled alike by 2^k (p is unchanged), k = -ilogb(Z);
// the result is k, or 0 when Z needs no scaling.
KLSERVE_HOST_DEVICE inline int NormaliserShift(double z) {
  return z > 0 && (z < 0x1p-100 || z > 0x1p100) ? -ilogb(z) : 0;
}

// Row t's causal cut: keys at or past it lie in the query's future, query t
// sitting at position t + q_offset. S when the problem is not causal.
KLSERVE_HOST_DEVICE inline int64_t CausalEnd(bool causal, int64_t t,
                                             int64_t q_offset, int64_t S) {
  if (!causal) return S;
  const int64_t end = t + q_offset + 1;
  return end < 0 ? 0 : (end > S ? S : end);
}

// The first row whose causal cut lies past `key`, so that it may see it: the
// inverse of CausalEnd, within [0, T]. 0 when the problem is not causal.
KLSERVE_HOST_DEVICE inline int64_t CausalFirstRow(bool causal, int64_t key,
                                                  int64_t q_offset, int64_t T) {
  if (!causal) return 0;
  const int64_t first = key - q_offset;  // t + q_offset + 1 > key
  return first < 0 ? 0 : (first > T ? T : first);
}

// Whether the row whose row_valid byte is row_valid[i] counts in the loss:
// the byte is nonzero, or the problem has no row_valid (null).
template <typename Byte>
KLSERVE_HOST_DEVICE inline bool RowCounts(const Byte* row_valid, int64_t i) {
  return row_valid == nullptr || row_valid[i] != Byte{0};
}

// Where row r's head h starts in a per-row tensor laid out with strides (in
// elements) from row origin_row, (b0, t0): (r / T - b0) * batch_stride +
// (r % T - t0) * row_stride + h * head_stride elements (RowView's rule).
KLSERVE_HOST_DEVICE inline int64_t StridedRowOffset(
    int64_t r, int64_t h, int64_t T, int64_t origin_row, int64_t batch_stride,
    int64_t row_stride, int64_t head_stride) {
  const int64_t b0 = origin_row / T, t0 = origin_row % T;
  return (r / T - b0) * batch_stride + (r % T - t0) * row_stride +
         h * head_stride;
}

// The value rules a row can break, in the order every backend checks them
// within a row (after the index rules of the sparse stage, which
// topk_check.h words). RowErrorStatus (value_errors.h) words each one.
enum class RowError : uint8_t {
  kNone = 0,
  kLogitsNotFinite,    // attention_logits: NaN or +inf at (head, slot)
  kLogitsAllMinusInf,  // attention_logits: a head is -inf at every valid key
  kWeightsBad,         // attention_weights: NaN, negative or +inf at slot
  kScoresNotFinite,    // indexer_scores: NaN or +inf at slot
  kScoresAllMinusInf,  // indexer_scores: -inf at every valid key
  kMinusInfWithMass,   // EXACT: score -inf at a slot where p > 0
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_ROW_RULES_H_
