// Checks of the projections-form reference: its gradients against finite
// differences of its loss, its top-k selection on rows worked by hand, and
// the key-head mapping of GQA/MQA against MHA with repeated key heads.

#include "tests/reference/projections_reference.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace klref {
namespace {

std::vector<double> Random(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

RefProjections RandomProblem(uint64_t seed, int64_t H_kv) {
  std::mt19937_64 rng(seed);
  RefProjections p;
  p.B = 2, p.T = 3, p.S = 5, p.H = 4, p.H_kv = H_kv, p.D = 3;
  p.H_I = 2, p.D_I = 4;
  p.query = Random(rng, p.B * p.T * p.H * p.D);
  p.key = Random(rng, p.B * p.S * p.H_kv * p.D);
  p.index_query = Random(rng, p.B * p.T * p.H_I * p.D_I);
  p.index_key = Random(rng, p.B * p.S * p.D_I);
  p.index_weights = Random(rng, p.B * p.T * p.H_I);
  p.options.causal = true;
  p.options.scaling_factor = 0.5;
  p.options.softmax_scale = 0.7;
  p.options.grad_scale = 3.0;
  return p;
}

// Whether some indexer dot product lies within `margin` of relu's kink,
// where finite differences of size h < margin would be wrong.
bool NearKink(const RefProjections& p, double margin) {
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.T; ++t) {
      for (int64_t j = 0; j < p.H_I; ++j) {
        for (int64_t s = 0; s < p.S; ++s) {
          double u = 0;
          for (int64_t d = 0; d < p.D_I; ++d) {
            u += p.index_query[((b * p.T + t) * p.H_I + j) * p.D_I + d] *
                 p.index_key[(b * p.S + s) * p.D_I + d];
          }
          if (std::abs(u) < margin) return true;
        }
      }
    }
  }
  return false;
}

// Central differences of the loss in every element of `input`, against
// `grad` (which includes grad_scale).
void ExpectFiniteDifferences(RefProjections p,
                             std::vector<double> RefProjections::*field,
                             const std::vector<double>& grad,
                             const std::vector<int64_t>& topk,
                             const char* name) {
  constexpr double kStep = 1e-6;
  std::vector<double>& input = p.*field;
  ASSERT_EQ(input.size(), grad.size()) << name;
  for (size_t i = 0; i < input.size(); ++i) {
    const double saved = input[i];
    input[i] = saved + kStep;
    const double up = ReferenceLoss(LogitsFormOf(p, topk));
    input[i] = saved - kStep;
    const double down = ReferenceLoss(LogitsFormOf(p, topk));
    input[i] = saved;
    const double numeric = p.options.grad_scale * (up - down) / (2 * kStep);
    EXPECT_NEAR(grad[i], numeric, 1e-6 * (1 + std::abs(numeric)))
        << name << "[" << i << "]";
  }
}

struct GradientCase {
  RefFlavor flavor;
  RefReduction reduction;
  bool use_relu;
  bool sparse;
};

class ProjectionsReferenceGradient
    : public ::testing::TestWithParam<GradientCase> {};

TEST_P(ProjectionsReferenceGradient, MatchesFiniteDifferences) {
  const GradientCase c = GetParam();
  for (uint64_t seed = 1; seed < 40; ++seed) {
    RefProjections p = RandomProblem(seed, /*H_kv=*/2);
    if (c.use_relu && NearKink(p, 1e-3)) continue;
    p.use_relu = c.use_relu;
    p.options.flavor = c.flavor;
    p.options.reduction = c.reduction;
    if (c.sparse) p.K = 3;  // the reference selects
    const RefProjectionsResult r = ComputeProjectionsReference(p);
    ASSERT_TRUE(r.kl.error.empty()) << r.kl.error;
    ASSERT_GT(r.kl.loss, 0);
    // The selection is held fixed: it is piecewise constant in the inputs.
    const std::vector<int64_t> topk = r.topk_indices;
    ExpectFiniteDifferences(p, &RefProjections::index_query, r.d_index_query,
                            topk, "d_index_query");
    ExpectFiniteDifferences(p, &RefProjections::index_key, r.d_index_key, topk,
                            "d_index_key");
    ExpectFiniteDifferences(p, &RefProjections::index_weights,
                            r.d_index_weights, topk, "d_index_weights");
    return;  // one problem away from the kink is enough per case
  }
  FAIL() << "every seed had a dot product near relu's kink";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ProjectionsReferenceGradient,
    ::testing::Values(
        GradientCase{RefFlavor::kExact, RefReduction::kMean, true, false},
        GradientCase{RefFlavor::kMaxText, RefReduction::kMeanValid, true,
                     false},
        GradientCase{RefFlavor::kExact, RefReduction::kSum, false, false},
        GradientCase{RefFlavor::kExact, RefReduction::kMean, true, true},
        GradientCase{RefFlavor::kMaxText, RefReduction::kSum, false, true}));

// One row, one indexer head of width 1 and no relu: I = index_key.
RefProjections ScoresAre(const std::vector<double>& scores, int64_t K) {
  RefProjections p;
  p.B = 1, p.T = 1, p.S = static_cast<int64_t>(scores.size());
  p.H = 1, p.H_kv = 1, p.D = 1, p.H_I = 1, p.D_I = 1;
  p.query = {1.0};
  p.key.assign(p.S, 0.0);
  p.index_query = {1.0};
  p.index_key = scores;
  p.index_weights = {1.0};
  p.index_weight_scale = 1.0;
  p.use_relu = false;
  p.K = K;
  return p;
}

TEST(ProjectionsReferenceSelection, HighestScoresInKeyOrder) {
  EXPECT_EQ(
      ComputeProjectionsReference(ScoresAre({0.5, 2, 3, -1}, 2)).topk_indices,
      (std::vector<int64_t>{1, 2}));
}

TEST(ProjectionsReferenceSelection, TiesGoToTheLowerKey) {
  EXPECT_EQ(
      ComputeProjectionsReference(ScoresAre({1, 2, 2, 2}, 2)).topk_indices,
      (std::vector<int64_t>{1, 2}));
}

TEST(ProjectionsReferenceSelection, FewerValidKeysLeaveEmptySlots) {
  RefProjections p = ScoresAre({4, 3, 2, 1}, 3);
  p.options.key_padding_mask = {1, 0, 0, 1};
  EXPECT_EQ(ComputeProjectionsReference(p).topk_indices,
            (std::vector<int64_t>{0, 3, -1}));
}

// Query head h reads key head h / (H / H_kv): MQA and GQA equal MHA with
// each key head repeated for its group.
TEST(ProjectionsReferenceHeads, GroupedKeysEqualRepeatedKeys) {
  for (int64_t H_kv : {1, 2}) {
    const RefProjections grouped = RandomProblem(7, H_kv);
    RefProjections repeated = grouped;
    repeated.H_kv = grouped.H;
    repeated.key.clear();
    const int64_t group = grouped.H / H_kv;
    for (int64_t bs = 0; bs < grouped.B * grouped.S; ++bs) {
      for (int64_t h = 0; h < grouped.H; ++h) {
        for (int64_t d = 0; d < grouped.D; ++d) {
          repeated.key.push_back(
              grouped.key[(bs * H_kv + h / group) * grouped.D + d]);
        }
      }
    }
    const RefProjectionsResult a = ComputeProjectionsReference(grouped);
    const RefProjectionsResult b = ComputeProjectionsReference(repeated);
    EXPECT_EQ(a.kl.loss, b.kl.loss) << H_kv;
    EXPECT_EQ(a.d_index_query, b.d_index_query) << H_kv;
  }
}

}  // namespace
}  // namespace klref
