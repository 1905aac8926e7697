#include "kernels/cpu/row_loss.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/cpu/row_convert.h"
#include "kernels/cpu/row_passes.h"
#include "kernels/value_errors.h"

namespace klserve::cpu {
namespace {

bool IsValid(const RowValidity& v, int64_t s) {
  return s < v.limit && (v.bytes == nullptr || v.bytes[s] != 0);
}

// Target mass on the k valid slots with the highest scores (ties: lower slot).
double TopkRecall(const IndexerKlProblem& p, const RowValidity& v,
                  const float* I, const RowTarget& target,
                  RowScratch& scratch) {
  auto* ranked = scratch.ranked();
  int64_t n = 0;
  for (int64_t s = 0; s < v.limit; ++s) {
    if (IsValid(v, s)) ranked[n++] = {I[s], static_cast<int32_t>(s)};
  }
  const int64_t k = std::min(p.options.recall_k, n);
  const auto higher = [](const std::pair<float, int32_t>& a,
                         const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::nth_element(ranked, ranked + k, ranked + n, higher);
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) mass += target.w[ranked[i].second];
  return mass / target.z;
}

// ScoreTermsRow with its template flags taken from the problem.
ScoreTerms ComputeScoreTerms(const IndexerKlProblem& p, const RowValidity& v,
                             const float* w, const float* I, float m, float* e,
                             Prefetcher& next) {
  const bool entropy = p.options.want_diagnostics;
  if (v.bytes != nullptr) {
    return entropy
               ? ScoreTermsRow<true, true>(w, I, v.limit, v.bytes, m, e, next)
               : ScoreTermsRow<true, false>(w, I, v.limit, v.bytes, m, e, next);
  }
  return entropy
             ? ScoreTermsRow<false, true>(w, I, v.limit, nullptr, m, e, next)
             : ScoreTermsRow<false, false>(w, I, v.limit, nullptr, m, e, next);
}

}  // namespace

absl::StatusOr<RowResult> ComputeRowLoss(
    const IndexerKlProblem& p, const RowData& data, int64_t r,
    const RowValidity& v, const RowTarget& target, float grad_scale,
    float* grad, Prefetcher& next, RowScratch& scratch) {
  const int64_t b = r / p.T, t = r % p.T;
  const float* I = FloatRow(data.scores.dtype, data.scores.Row(r, p.T), p.K,
                            scratch.scores());
  const ScanResult scan =
      v.bytes != nullptr ? ScanLogits<true>(I, p.K, v.limit, v.bytes, next)
                         : ScanLogits<false>(I, p.K, v.limit, nullptr, next);
  if (scan.any_bad) {
    const int64_t j = FirstBadValue(I, p.K, /*weights=*/false);
    return ValueError("indexer_scores", "scores must not be NaN or +inf",
                      DescribeValue(I[j]), {b, t, j});
  }
  if (v.count > 0 && scan.max == -kInf) {
    return ValueError("indexer_scores",
                      "a row with valid keys needs a finite score at one",
                      "-inf at every valid key", {b, t});
  }
  RowResult result;
  // Rows without a KL stop before any exp (with no valid key the maximum is
  // -inf, and -inf - (-inf) would be NaN).
  if (v.count == 0 || target.zero) {
    result.kind = v.count == 0 ? RowResult::Kind::kFullyMasked
                               : RowResult::Kind::kZeroTarget;
    if (grad != nullptr) std::fill(grad, grad + p.K, 0.0f);
    return result;
  }

  const float m = scan.max;
  const ScoreTerms terms =
      ComputeScoreTerms(p, v, target.w, I, m, scratch.e(), next);
  const double l = terms.sum_e;
  const bool exact = p.options.flavor == Flavor::kExact;
  if (exact && terms.mass_on_minus_inf) {
    int64_t j = 0;
    while (!(target.w[j] > 0 && I[j] == -kInf)) ++j;
    return ValueError("indexer_scores",
                      "EXACT needs a finite score wherever the target has "
                      "mass (the KL would be infinite; MAXTEXT computes it)",
                      "-inf", {b, t, j});
  }
  const double log_z = std::log(target.z);
  const double log_l = std::log(l);
  const double sum_w_log_w =
      std::numbers::ln2 * terms.sum_w_exponent + terms.sum_w_mantissa_log;
  const float inv_l = static_cast<float>(1.0 / l);
  const float inv_z = static_cast<float>(1.0 / target.z);

  result.kind = RowResult::Kind::kComputed;
  MaxTextTerms maxtext;
  if (exact) {
    // sum_s p_s (log p_s - log q_s) with log p = log w - log Z and
    // log q = (I - m) - log L, expanded into the row sums.
    result.kl = (sum_w_log_w - terms.sum_w * log_z -
                 (terms.sum_w_scores - m * terms.sum_w) + terms.sum_w * log_l) /
                target.z;
  } else {
    maxtext = MaxTextTermsRow(scratch.e(), target.w, inv_l, inv_z, v.limit);
    result.kl = maxtext.kl;
  }
  if (p.options.want_diagnostics) {
    result.entropy_p = (terms.sum_w * log_z - sum_w_log_w) / target.z;
    result.entropy_q = log_l - terms.sum_e_shifted / l;
    if (p.options.recall_k > 0) {
      result.recall = TopkRecall(p, v, I, target, scratch);
    }
  }
  if (grad != nullptr) {
    if (exact) {
      ExactGradRow(scratch.e(), target.w, inv_l, inv_z, grad_scale, v.limit,
                   grad);
    } else {
      MaxTextGradRow(scratch.e(), target.w, inv_l, inv_z,
                     static_cast<float>(maxtext.sum_qg), grad_scale, v.limit,
                     grad);
    }
    std::fill(grad + v.limit, grad + p.K, 0.0f);
  }
  return result;
}

}  // namespace klserve::cpu
