// The returned gradient against finite differences: of the library's own
// float32 loss (coarse step, small smooth problems) and of the reference's
// float64 loss (fine step, random problems with masks), for both flavours.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/problem.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klserve::testdata {
namespace {

// A small problem with smooth values: two rows, six keys, one empty slot in
// the sparse forms (five slots); in row 1 one key with p > 0 gets a very low
// score (q far below MaxText's 1e-8), where the flavours' gradients differ
// most.
Case SmallCase(InputForm form, Flavor flavor, uint64_t seed) {
  CaseSpec spec;
  spec.B = 1;
  spec.T = 2;
  spec.S = 6;
  spec.form = form;
  spec.H = 2;
  spec.K = 5;
  spec.empty_slot_fraction = 0;
  spec.logit_spread = 1.0;
  spec.score_spread = 1.0;
  spec.zero_weight_fraction = 0;
  spec.options.flavor = flavor;
  spec.options.reduction = Reduction::kMean;
  spec.options.scaling_factor = 0.75;
  spec.options.want_diagnostics = false;
  Case c = MakeRandomCase(spec, seed);
  if (c.sparse()) c.topk_indices->at({0, 0, 2}) = -1;
  c.indexer_scores.at({0, 1, 3}) = -25;
  return c;
}

// The suite runs on every backend (test_backends.h); its helpers compute
// with the backend under test.
class GradientCheck : public BackendTest {};
KLSERVE_INSTANTIATE_ON_BACKENDS(GradientCheck);

TEST_P(GradientCheck, LibraryGradientMatchesFloat32FiniteDifferences) {
  uint64_t seed = 1;
  for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
    for (InputForm form : kInputForms) {
      const Case c = SmallCase(form, flavor, seed++);
      SCOPED_TRACE(std::string(flavor == Flavor::kExact ? "EXACT" : "MAXTEXT") +
                   " " + InputFormName(form));
      const LibOutput base = RunLibrary(c);
      ASSERT_TRUE(base.status.ok()) << base.status;
      const std::vector<double>& grad = base.grad;
      // h = 1e-2: truncation ~h^2 = 1e-4 relative to O(1) third
      // derivatives; float32 noise in the loss (~1e-7) over 2h is ~5e-6.
      const double h = 1e-2;
      for (size_t i = 0; i < grad.size(); ++i) {
        Case plus = c, minus = c;
        plus.indexer_scores.values[i] += h;
        minus.indexer_scores.values[i] -= h;
        const double step = static_cast<double>(static_cast<float>(
                                plus.indexer_scores.values[i])) -
                            static_cast<float>(minus.indexer_scores.values[i]);
        const double fd = (LibraryLoss(plus) - LibraryLoss(minus)) / step;
        EXPECT_NEAR(grad[i], fd, 2e-4) << "score " << i;
      }
    }
  }
}

TEST_P(GradientCheck, MaxTextDampsThePullOnTinyProbabilities) {
  // At a key with p > 0 and q ~ 1e-11 the exact gradient is about -p, the
  // MaxText one about -p * q / 1e-8: finite differences tell them apart.
  const Case exact = SmallCase(InputForm::kDenseAggregated, Flavor::kExact, 5);
  const Case maxtext =
      SmallCase(InputForm::kDenseAggregated, Flavor::kMaxText, 5);
  const int64_t i = 1 * 6 + 3;  // row 1, key 3
  const LibOutput a = RunLibrary(exact), b = RunLibrary(maxtext);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_LT(a.grad[i], -1e-3);
  EXPECT_LT(std::fabs(b.grad[i]), 0.05 * std::fabs(a.grad[i]));
}

// Central differences of the reference's float64 loss in the scores.
std::vector<double> ReferenceFiniteDifferences(const klref::RefProblem& pr) {
  std::vector<double> fd(pr.scores.size(), 0.0);
  for (size_t i = 0; i < pr.scores.size(); ++i) {
    if (!std::isfinite(pr.scores[i])) continue;  // -inf stays -inf
    const double h = 1e-6 * std::max(1.0, std::fabs(pr.scores[i]));
    klref::RefProblem plus = pr, minus = pr;
    plus.scores[i] += h;
    minus.scores[i] -= h;
    fd[i] = (klref::ReferenceLoss(plus) - klref::ReferenceLoss(minus)) /
            (plus.scores[i] - minus.scores[i]);
  }
  return fd;
}

// Random cases with masks, both stages and both flavours; float32 gradient.
std::vector<Case> RandomFdCases() {
  std::mt19937_64 rng(4242);
  std::vector<Case> cases;
  for (int i = 0; i < 40; ++i) {
    CaseSpec spec = RandomSpec(rng);
    spec.B = std::min<int64_t>(spec.B, 2);
    spec.T = std::min<int64_t>(spec.T, 5);
    spec.S = std::min<int64_t>(spec.S, 12);
    if (IsSparse(spec.form)) spec.K = std::min<int64_t>(spec.K, spec.S + 2);
    spec.options.flavor = i % 2 == 0 ? Flavor::kExact : Flavor::kMaxText;
    spec.options.grad_dtype = DType::kFloat32;
    if (spec.options.scaling_factor == 0) spec.options.scaling_factor = 0.3;
    spec.options.want_diagnostics = false;
    spec.score_spread = std::min(spec.score_spread, 2.0);
    cases.push_back(MakeRandomCase(spec, 50 + i));
  }
  return cases;
}

// The reference alone: no backend.
TEST(ReferenceGradientCheck, MatchesItsFiniteDifferences) {
  for (const Case& c : RandomFdCases()) {
    const klref::RefProblem pr = ToReference(c);
    const klref::RefResult ref = klref::ComputeReference(pr);
    ASSERT_EQ(ref.error, "");
    const std::vector<double> fd = ReferenceFiniteDifferences(pr);
    double max_abs = 1e-300;
    for (double g : ref.grad) max_abs = std::max(max_abs, std::fabs(g));
    for (size_t i = 0; i < fd.size(); ++i) {
      ASSERT_NEAR(ref.grad[i], fd[i], 1e-6 * max_abs + 1e-12) << i;
    }
  }
}

TEST_P(GradientCheck, LibraryGradientMatchesFloat64FiniteDifferences) {
  int case_index = 0;
  for (const Case& c : RandomFdCases()) {
    SCOPED_TRACE("case " + std::to_string(case_index++));
    const LibOutput lib = RunLibrary(c);
    ASSERT_TRUE(lib.status.ok()) << lib.status;
    const std::vector<double> fd = ReferenceFiniteDifferences(ToReference(c));
    double max_abs = 0;
    for (double g : fd) max_abs = std::max(max_abs, std::fabs(g));
    // Float32 q - p is good to ~1e-6 * c / N even where the gradient
    // vanishes (rows with one valid key).
    const double floor = 1e-6 * std::fabs(c.options.scaling_factor) /
                         std::max<int64_t>(lib.result.denominator, 1);
    int failures = 0;
    for (size_t i = 0; i < fd.size() && failures < 5; ++i) {
      if (std::fabs(lib.grad[i] - fd[i]) > 1e-4 * max_abs + floor) {
        ++failures;
        ADD_FAILURE() << "score " << i << ": library " << lib.grad[i]
                      << ", finite differences " << fd[i];
      }
    }
  }
}

}  // namespace
}  // namespace klserve::testdata
