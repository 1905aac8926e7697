#include "kernels/cpu/variant/row_target.h"

#include <cmath>
#include <utility>

#include "kernels/cpu/variant/row_convert.h"
#include "kernels/row_rules.h"
#include "kernels/value_errors.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

template <bool kMasked>
absl::StatusOr<RowTarget> PerHead(const IndexerKlProblem& p,
                                  const RowData& data, int64_t r,
                                  const RowValidity& v, RowScratch& scratch) {
  const int64_t b = r / p.T, t = r % p.T;
  const float scale = p.options.softmax_scale;
  const auto head_row = [&](int64_t h, float* buffer) {
    return FloatRow(data.target.dtype, data.target.Row(r, p.T, h), p.row_length,
                    buffer);
  };
  float* buffer = scratch.target();
  float* next_buffer = scratch.next_target();
  // Head h's exponentials go to e; head h - 1's, with their 1 / sum in
  // a_prev, wait in e_prev to be folded into w during head h's loop. The
  // exponentials carry 2^kSoftmaxHeadroom, and 1 / sum its inverse.
  float* e = scratch.e();
  float* e_prev = scratch.previous_e();
  float a_prev = 0;
  const float* x = head_row(0, buffer);
  ScanResult scan = ScanLogits<kMasked>(x, p.row_length, v.limit, v.bytes);
  const auto not_finite = [&](int64_t h, const float* x) {
    const int64_t j = BadValueToReport(x, p.row_length, /*weights=*/false);
    return RowErrorStatus(RowError::kLogitsNotFinite,
                          {.b = b, .t = t, .h = h, .j = j, .value = x[j]});
  };
  for (int64_t h = 0; h < p.H; ++h) {
    if (scan.any_bad) return not_finite(h, x);
    if (v.count > 0 && scan.max == -kInf) {
      return RowErrorStatus(RowError::kLogitsAllMinusInf,
                            {.b = b, .t = t, .h = h});
    }
    const float* x_next = h + 1 < p.H ? head_row(h + 1, next_buffer) : nullptr;
    if (v.count == 0) {  // fully masked: checks only
      if (x_next != nullptr) {
        scan = ScanLogits<kMasked>(x_next, p.row_length, v.limit, v.bytes);
      }
    } else {
      // The last head checks itself again rather than a next one: one loop
      // shape for all heads. Prefetching the head after next only needs its
      // address, whatever its dtype.
      const float* checked = x_next != nullptr ? x_next : x;
      const float* ahead =
          h + 2 < p.H
              ? reinterpret_cast<const float*>(data.target.Row(r, p.T, h + 2))
              : checked;
      // Head 0 zeroes w; each later head adds the previous one's.
      const auto exp_row = [&](auto fold) {
        BothExtras<ScanNextHead<kMasked>, decltype(fold)> extras{
            ScanNextHead<kMasked>(checked, ahead, v.bytes), fold};
        const double sum = ExpRow<kMasked, kSoftmaxHeadroom>(
            x, v.limit, v.bytes, scan.max, scale, e, extras);
        scan = extras.a.Result(p.row_length, v.limit);
        return sum;
      };
      const double sum =
          h == 0 ? exp_row(ZeroRow{scratch.w()})
                 : exp_row(AccumulatePreviousHead{scratch.w(), e_prev, a_prev});
      if (HeadSumIsBad(sum)) return not_finite(h, x);
      a_prev = static_cast<float>(1.0 / sum);
      std::swap(e, e_prev);
      // Head h - 1, folded in this loop, ended a block of heads.
      if (h % kHeadsPerFloatSum == 0 && h > 0) {
        FoldHeadBlock(scratch.w(), scratch.head_sums(), v.limit,
                      /*first=*/h == kHeadsPerFloatSum);
      }
    }
    x = x_next;
    std::swap(buffer, next_buffer);
  }
  // w accumulates sum_h P_h, P_h = softmax(scale * x) over valid slots; the
  // last head is still to add.
  if (v.count > 0) {
    AccumulateHead(scratch.w(), e_prev, a_prev, v.limit);
    if (p.H > kHeadsPerFloatSum) {
      FinishHeadSums(scratch.w(), scratch.head_sums(), v.limit);
    }
  }
  RowTarget target;
  target.w = scratch.w();
  target.z = TargetNormaliser(static_cast<double>(p.H),
                              p.options.flavor == Flavor::kMaxText);
  return target;
}

}  // namespace

absl::StatusOr<RowTarget> LoadPerHeadTarget(const IndexerKlProblem& problem,
                                            const RowData& data, int64_t r,
                                            const RowValidity& validity,
                                            RowScratch& scratch) {
  return validity.bytes != nullptr
             ? PerHead<true>(problem, data, r, validity, scratch)
             : PerHead<false>(problem, data, r, validity, scratch);
}

RowTarget AggregatedTarget(const IndexerKlProblem& p, const RowValidity& v,
                           const float* w, double weight_sum,
                           RowScratch& scratch, bool& rescaled) {
  RowTarget target;
  target.w = w;
  target.zero = v.count > 0 && weight_sum == 0;
  target.z = TargetNormaliser(weight_sum, p.options.flavor == Flavor::kMaxText);
  // Keeps 1 / Z a normal float (NormaliserShift). Rare, so a plain loop.
  const int k = NormaliserShift(target.z);
  rescaled = k != 0;
  if (rescaled) {
    float* scaled = scratch.w();
    for (int64_t s = 0; s < v.limit; ++s) {
      scaled[s] = std::ldexp(target.w[s], k);
    }
    target.w = scaled;
    target.z = std::ldexp(target.z, k);
  }
  return target;
}

}  // namespace klserve::cpu::KLSERVE_ISA
