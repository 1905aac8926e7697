#include "kernels/cpu/row_target.h"

#include <cmath>

#include "kernels/cpu/row_convert.h"
#include "kernels/cpu/row_passes.h"
#include "kernels/value_errors.h"

namespace klserve::cpu {
namespace {

absl::StatusOr<RowTarget> LoadWeights(const IndexerKlProblem& p,
                                      const RowData& data, int64_t r,
                                      const RowValidity& v, Prefetcher& next,
                                      RowScratch& scratch) {
  const float* x = FloatRow(data.target.dtype, data.target.Row(r, p.T), p.K,
                            scratch.target());
  // Zero the invalid slots into scratch only when some slot below the limit
  // is invalid; otherwise w is the row itself.
  float* copy = v.bytes != nullptr ? scratch.w() : nullptr;
  const ScanResult scan =
      v.bytes != nullptr
          ? ScanWeights<true>(x, p.K, v.limit, v.bytes, copy, next)
          : ScanWeights<false>(x, p.K, v.limit, nullptr, copy, next);
  if (scan.any_bad) {
    const int64_t j = FirstBadValue(x, p.K, /*weights=*/true);
    return ValueError("attention_weights", "weights must be finite and >= 0",
                      DescribeValue(x[j]), {r / p.T, r % p.T, j});
  }
  RowTarget target;
  target.w = copy != nullptr ? copy : x;
  target.zero = v.count > 0 && scan.sum == 0;
  target.z = p.options.flavor == Flavor::kMaxText ? scan.sum + kMaxTextEpsilon
                                                  : scan.sum;
  // The passes form p = w / Z in float as w * (1 / Z). Far from 1, 1 / Z
  // would overflow or lose bits in float: scale w and Z alike by a power of
  // two, which leaves p as it is. Rare, so a plain loop.
  if (target.z > 0 && (target.z < 0x1p-100 || target.z > 0x1p100)) {
    const int k = -std::ilogb(target.z);
    float* scaled = scratch.w();
    for (int64_t s = 0; s < v.limit; ++s) {
      scaled[s] = std::ldexp(target.w[s], k);
    }
    target.w = scaled;
    target.z = std::ldexp(target.z, k);
  }
  return target;
}

absl::StatusOr<RowTarget> LoadPerHead(const IndexerKlProblem& p,
                                      const RowData& data, int64_t r,
                                      const RowValidity& v, Prefetcher& next,
                                      RowScratch& scratch) {
  const float scale = p.options.softmax_scale;
  const int64_t head_bytes = p.K * DTypeSize(data.target.dtype);
  Prefetcher no_prefetch;
  for (int64_t h = 0; h < p.H; ++h) {
    // Head rows lie T * K elements apart: fetch the next one ahead, since
    // the hardware prefetcher stops at page boundaries.
    Prefetcher next_head =
        h + 1 < p.H
            ? Prefetcher(data.target.Row(r, p.T, h + 1), nullptr, head_bytes)
            : next;
    const float* x = FloatRow(data.target.dtype, data.target.Row(r, p.T, h),
                              p.K, scratch.target());
    const ScanResult scan =
        v.bytes != nullptr
            ? ScanLogits<true>(x, p.K, v.limit, v.bytes, no_prefetch)
            : ScanLogits<false>(x, p.K, v.limit, nullptr, no_prefetch);
    if (scan.any_bad) {
      const int64_t j = FirstBadValue(x, p.K, /*weights=*/false);
      return ValueError("attention_logits", "logits must not be NaN or +inf",
                        DescribeValue(x[j]), {r / p.T, h, r % p.T, j});
    }
    if (v.count == 0) continue;  // fully masked: checks only
    if (scan.max == -kInf) {
      return ValueError("attention_logits",
                        "a head needs a finite logit at some valid key",
                        "-inf at every valid key", {r / p.T, h, r % p.T});
    }
    // P_h = softmax(scale * x) over valid slots; w accumulates sum_h P_h.
    const double sum = v.bytes != nullptr
                           ? ExpRow<true>(x, v.limit, v.bytes, scan.max, scale,
                                          scratch.e(), next_head)
                           : ExpRow<false>(x, v.limit, nullptr, scan.max, scale,
                                           scratch.e(), next_head);
    AccumulateHead(scratch.w(), scratch.e(), static_cast<float>(1.0 / sum),
                   v.limit, h == 0);
  }
  RowTarget target;
  target.w = scratch.w();
  target.z = p.options.flavor == Flavor::kMaxText
                 ? static_cast<double>(p.H) + kMaxTextEpsilon
                 : static_cast<double>(p.H);
  return target;
}

}  // namespace

absl::StatusOr<RowTarget> LoadRowTarget(const IndexerKlProblem& problem,
                                        const RowData& data, int64_t r,
                                        const RowValidity& validity,
                                        Prefetcher& next, RowScratch& scratch) {
  return problem.per_head
             ? LoadPerHead(problem, data, r, validity, next, scratch)
             : LoadWeights(problem, data, r, validity, next, scratch);
}

}  // namespace klserve::cpu
