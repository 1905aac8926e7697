#include "kernels/cpu/variant/row_loss.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>

#include "kernels/cpu/variant/log_double.h"
#include "kernels/cpu/variant/row_convert.h"
#include "kernels/cpu/variant/row_passes.h"
#include "kernels/cpu/variant/row_target.h"
#include "kernels/tensor_checks.h"
#include "kernels/value_errors.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

bool IsValid(const RowValidity& v, int64_t s) {
  return s < v.limit && (v.bytes == nullptr || v.bytes[s] != 0);
}

// Target mass on the k valid slots with the highest scores, ties to the
// lower key, as the top-k selection's: the order of a sparse row's slots
// changes nothing (ties are common: relu leaves many scores at exactly 0).
double TopkRecall(const IndexerKlProblem& p, const RowValidity& v,
                  const float* I, const RowTarget& target,
                  RowScratch& scratch) {
  auto* ranked = scratch.ranked();
  int64_t n = 0;
  for (int64_t s = 0; s < v.limit; ++s) {
    // The scores were checked finite, but a shared-memory region may have
    // changed since (docs/shared-memory.md): a NaN here would break the
    // strict order nth_element relies on to stay within the array.
    const float score = I[s] == I[s] ? I[s] : -HUGE_VALF;
    if (IsValid(v, s)) ranked[n++] = {score, static_cast<int32_t>(s)};
  }
  const int64_t k = std::min(p.options.recall_k, n);
  const auto key = [&v](int32_t slot) {
    return v.keys != nullptr ? LoadInt32(v.keys + 4 * int64_t{slot}) : slot;
  };
  const auto higher = [&key](const std::pair<float, int32_t>& a,
                             const std::pair<float, int32_t>& b) {
    return a.first > b.first ||
           (a.first == b.first && key(a.second) < key(b.second));
  };
  std::nth_element(ranked, ranked + k, ranked + n, higher);
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) mass += target.w[ranked[i].second];
  // mass and z sum the same weights in other orders: at most 1 but for
  // rounding (recall_k >= S read 1.0000000005).
  return std::min(mass / target.z, 1.0);
}

// The target's weights and the scores, each checked everywhere in the row,
// and the target terms; see ScanRow.
struct ScannedRow {
  RowTarget target;
  const float* I = nullptr;
  ScanResult scores;
  // Without NeedsTargetLogTerms, sum_w and mass_on_minus_inf only.
  TargetTerms terms;
};

// Whether a row needs the target's log terms (TargetTermsSums): the EXACT KL
// is made of them, and so is the diagnostics' entropy of p. Otherwise the
// scan takes sum(w) only (TargetWeightSum).
bool NeedsTargetLogTerms(const IndexerKlProblem& p) {
  return p.options.flavor == Flavor::kExact || p.options.want_diagnostics;
}

// f.template operator()<kMasked, Terms>() with the row's mask kind and the
// target sums it needs.
template <typename F>
auto ForRowKind(const IndexerKlProblem& p, const RowValidity& v, F&& f) {
  using Logs = TargetTermsSums<false>;
  using SumOnly = TargetWeightSum;
  const bool logs = NeedsTargetLogTerms(p);
  if (v.bytes != nullptr) {
    return logs ? f.template operator()<true, Logs>()
                : f.template operator()<true, SumOnly>();
  }
  return logs ? f.template operator()<false, Logs>()
              : f.template operator()<false, SumOnly>();
}

// A built target (per-head, or the projections form's) against scores I in
// float: the pass over I. With no valid slot, w is undefined: checks only.
template <bool kMasked, typename Terms>
ScannedRow ScanBuiltTarget(const IndexerKlProblem& p, const RowValidity& v,
                           const RowTarget& target, const float* I,
                           Prefetcher& next) {
  ScannedRow row;
  row.target = target;
  row.I = I;
  if (v.count == 0) {
    row.scores = ScanLogits<kMasked>(I, p.row_length, v.limit, v.bytes);
    return row;
  }
  const RowScan scan = ScanRow<kMasked, false, Terms>(
      target.w, I, p.row_length, v.limit, v.bytes, nullptr, next);
  row.scores = scan.scores;
  row.terms = scan.terms;
  return row;
}

template <bool kMasked, typename Terms>
absl::StatusOr<ScannedRow> ScanTargetAndScores(const IndexerKlProblem& p,
                                               const RowData& data, int64_t r,
                                               const RowValidity& v,
                                               Prefetcher& next,
                                               RowScratch& scratch) {
  ScannedRow row;
  Prefetcher none;
  if (p.per_head()) {
    // The per-head target is built first (its heads stream in as they
    // compute); the scores then pass once against it.
    absl::StatusOr<RowTarget> target =
        LoadPerHeadTarget(p, data, r, v, scratch);
    if (!target.ok()) return target.status();
    return ScanBuiltTarget<kMasked, Terms>(
        p, v, *target,
        FloatRow(data.scores.dtype, data.scores.Row(r, p.T), p.row_length,
                 scratch.scores()),
        next);
  }
  // Head-aggregated: one pass streams the weights and the scores together.
  const float* x = FloatRow(data.target.dtype, data.target.Row(r, p.T),
                            p.row_length, scratch.target());
  row.I = FloatRow(data.scores.dtype, data.scores.Row(r, p.T), p.row_length,
                   scratch.scores());
  float* masked_copy = kMasked ? scratch.w() : nullptr;
  const RowScan scan = ScanRow<kMasked, true, Terms>(
      x, row.I, p.row_length, v.limit, v.bytes, masked_copy, next);
  if (scan.target.any_bad) {
    const int64_t j = BadValueToReport(x, p.row_length, /*weights=*/true);
    return RowErrorStatus(RowError::kWeightsBad,
                          {.b = r / p.T, .t = r % p.T, .j = j, .value = x[j]});
  }
  bool rescaled;
  row.target = AggregatedTarget(p, v, kMasked ? masked_copy : x,
                                scan.target.sum, scratch, rescaled);
  row.scores = scan.scores;
  row.terms = scan.terms;
  // The terms follow the rescaled weights; sum(w) alone is not read again.
  if (rescaled && !std::is_same_v<Terms, TargetWeightSum>) {
    row.terms =
        ScanRow<kMasked, false, Terms>(row.target.w, row.I, p.row_length,
                                       v.limit, v.bytes, nullptr, none)
            .terms;
  }
  return row;
}

// The ExpRow extra of a row's loss: the sum of the entropy of q
// (diagnostics) and the EXACT KL's cross term, each only where it is read.
template <bool kEntropy, bool kCross>
struct RowLossSums {
  EntropySum entropy;
  ShiftedScoreSum cross;

  void operator()(int64_t i, int64_t count, VecF d, VecF e) {
    if constexpr (kEntropy) entropy(i, count, d, e);
    if constexpr (kCross) cross(i, count, d, e);
  }
};

// The loss and gradient of a row once its target and scores are scanned.
template <bool kMasked>
absl::StatusOr<RowResult> ScannedRowLoss(const IndexerKlProblem& p, int64_t r,
                                         const RowValidity& v,
                                         const ScannedRow& scanned,
                                         float grad_scale, float* grad,
                                         bool grad_is_output,
                                         RowScratch& scratch) {
  const int64_t b = r / p.T, t = r % p.T;
  const RowTarget& target = scanned.target;
  const float* I = scanned.I;
  const TargetTerms& terms = scanned.terms;
  if (scanned.scores.any_bad) {
    const int64_t j = BadValueToReport(I, p.row_length, /*weights=*/false);
    return RowErrorStatus(RowError::kScoresNotFinite,
                          {.b = b, .t = t, .j = j, .value = I[j]});
  }
  const float m = scanned.scores.max;
  if (v.count > 0 && m == -kInf) {
    return RowErrorStatus(RowError::kScoresAllMinusInf, {.b = b, .t = t});
  }
  RowResult result;
  // Rows without a KL stop before any exp (with no valid key the maximum is
  // -inf, and -inf - (-inf) would be NaN).
  if (v.count == 0 || target.zero) {
    result.kind = v.count == 0 ? RowResult::Kind::kFullyMasked
                               : RowResult::Kind::kZeroTarget;
    if (grad != nullptr) std::fill(grad, grad + p.row_length, 0.0f);
    return result;
  }
  if (p.options.flavor == Flavor::kExact && terms.mass_on_minus_inf) {
    // Bounded: the scores may have changed since the scan (a region).
    int64_t j = 0;
    while (j + 1 < p.row_length && !(target.w[j] > 0 && I[j] == -kInf)) ++j;
    return RowErrorStatus(RowError::kMinusInfWithMass,
                          {.b = b, .t = t, .j = j});
  }

  // q's normaliser L = sum(exp(I - m)), with the exponentials kept in e, and
  // in the same pass the sums that need m: the entropy of q's (diagnostics)
  // and, past kShiftedCrossTermAbove, the EXACT KL's cross term.
  const bool exact = p.options.flavor == Flavor::kExact;
  const bool shifted = exact && std::fabs(m) > kShiftedCrossTermAbove;
  EntropySum entropy;
  ShiftedScoreSum cross{target.w, I, m};
  const auto exp_row = [&]<bool kEntropy, bool kCross>() {
    RowLossSums<kEntropy, kCross> sums{entropy, cross};
    const double sum =
        ExpRow<kMasked>(I, v.limit, v.bytes, m, 1.0f, scratch.e(), sums);
    entropy = sums.entropy;
    cross = sums.cross;
    return sum;
  };
  const double l =
      p.options.want_diagnostics
          ? (shifted ? exp_row.template operator()<true, true>()
                     : exp_row.template operator()<true, false>())
          : (shifted ? exp_row.template operator()<false, true>()
                     : exp_row.template operator()<false, false>());
  const double log_z = LogDouble(target.z);
  const double log_l = LogDouble(l);
  const double sum_w_log_w =
      std::numbers::ln2 * terms.sum_w_exponent + terms.sum_w_mantissa_log;
  const float inv_l = static_cast<float>(1.0 / l);
  const float inv_z = static_cast<float>(1.0 / target.z);

  result.kind = RowResult::Kind::kComputed;
  MaxTextTerms maxtext;
  if (exact) {
    // sum_s p_s (log p_s - log q_s) with log p = log w - log Z and
    // log q = (I - m) - log L, expanded into the row sums.
    const double cross_term =
        shifted ? cross.Result() : terms.sum_w_scores - m * terms.sum_w;
    result.kl =
        (sum_w_log_w - terms.sum_w * log_z - cross_term + terms.sum_w * log_l) /
        target.z;
  } else {
    maxtext = MaxTextTermsRow(scratch.e(), target.w, inv_l, inv_z, v.limit,
                              scratch.maxtext_g());
    result.kl = maxtext.kl;
  }
  if (p.options.want_diagnostics) {
    result.entropy_p = (terms.sum_w * log_z - sum_w_log_w) / target.z;
    result.entropy_q = log_l - ReduceSum(entropy.sum) / l;
    if (p.options.recall_k > 0) {
      result.recall = TopkRecall(p, v, I, target, scratch);
    }
  }
  if (grad != nullptr) {
    if (exact) {
      ExactGradRow(scratch.e(), target.w, inv_l, inv_z, grad_scale, v.limit,
                   grad, grad_is_output);
    } else {
      MaxTextGradRow(scratch.e(), scratch.maxtext_g(), inv_l,
                     static_cast<float>(maxtext.sum_qg), grad_scale, v.limit,
                     grad, grad_is_output);
    }
    std::fill(grad + v.limit, grad + p.row_length, 0.0f);
  }
  return result;
}

template <bool kMasked, typename Terms>
absl::StatusOr<RowResult> RowLoss(const IndexerKlProblem& p,
                                  const RowData& data, int64_t r,
                                  const RowValidity& v, float grad_scale,
                                  float* grad, bool grad_is_output,
                                  Prefetcher& next, RowScratch& scratch) {
  absl::StatusOr<ScannedRow> scanned =
      ScanTargetAndScores<kMasked, Terms>(p, data, r, v, next, scratch);
  if (!scanned.ok()) return scanned.status();
  return ScannedRowLoss<kMasked>(p, r, v, *scanned, grad_scale, grad,
                                 grad_is_output, scratch);
}

template <bool kMasked, typename Terms>
absl::StatusOr<RowResult> BuiltTargetLoss(const IndexerKlProblem& p, int64_t r,
                                          const RowValidity& v,
                                          const RowTarget& target,
                                          const float* I, float grad_scale,
                                          float* grad, RowScratch& scratch) {
  Prefetcher none;
  const ScannedRow scanned =
      ScanBuiltTarget<kMasked, Terms>(p, v, target, I, none);
  return ScannedRowLoss<kMasked>(p, r, v, scanned, grad_scale, grad,
                                 /*grad_is_output=*/false, scratch);
}

}  // namespace

absl::StatusOr<RowResult> ComputeRowLossFromTarget(
    const IndexerKlProblem& problem, int64_t r, const RowValidity& validity,
    const RowTarget& target, const float* scores, float grad_scale, float* grad,
    RowScratch& scratch) {
  return ForRowKind(problem, validity, [&]<bool kMasked, typename Terms>() {
    return BuiltTargetLoss<kMasked, Terms>(problem, r, validity, target, scores,
                                           grad_scale, grad, scratch);
  });
}

absl::StatusOr<RowResult> ComputeRowLoss(const IndexerKlProblem& problem,
                                         const RowData& data, int64_t r,
                                         const RowValidity& validity,
                                         float grad_scale, float* grad,
                                         bool grad_is_output, Prefetcher& next,
                                         RowScratch& scratch) {
  return ForRowKind(problem, validity, [&]<bool kMasked, typename Terms>() {
    return RowLoss<kMasked, Terms>(problem, data, r, validity, grad_scale, grad,
                                   grad_is_output, next, scratch);
  });
}

}  // namespace klserve::cpu::KLSERVE_ISA
