// Checks of the float64 reference itself (its codecs and a few losses worked
// by hand), so that agreement with it means something.

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ReferenceSelf, BFloat16KnownBits) {
  EXPECT_EQ(EncodeBFloat16(1.0), 0x3F80);
  EXPECT_EQ(EncodeBFloat16(-2.0), 0xC000);
  EXPECT_EQ(EncodeBFloat16(0.0), 0x0000);
  EXPECT_EQ(EncodeBFloat16(-0.0), 0x8000);
  EXPECT_EQ(EncodeBFloat16(kInf), 0x7F80);
  EXPECT_EQ(EncodeBFloat16(-kInf), 0xFF80);
  EXPECT_TRUE(std::isnan(DecodeBFloat16(EncodeBFloat16(std::nan("")))));
  // Halfway between 1 and 1 + 2^-7: ties to the even 1.0.
  EXPECT_EQ(EncodeBFloat16(1.0 + 0x1p-8), 0x3F80);
  // Halfway between 1 + 2^-7 and 1 + 2^-6: ties to the even 1 + 2^-6.
  EXPECT_EQ(EncodeBFloat16(1.0 + 3 * 0x1p-8), 0x3F82);
  EXPECT_EQ(EncodeBFloat16(1.0 + 0x1p-8 + 0x1p-20), 0x3F81);
  EXPECT_EQ(DecodeBFloat16(0x7F7F), 0x1.FEp127);
  EXPECT_EQ(DecodeBFloat16(0x0001), 0x1p-133);
  EXPECT_EQ(EncodeBFloat16(0x1.FFp127), 0x7F80);  // rounds past the max
}

TEST(ReferenceSelf, Float16KnownBits) {
  EXPECT_EQ(EncodeFloat16(1.0), 0x3C00);
  EXPECT_EQ(EncodeFloat16(-1.5), 0xBE00);
  EXPECT_EQ(EncodeFloat16(65504.0), 0x7BFF);
  EXPECT_EQ(EncodeFloat16(65519.0), 0x7BFF);
  EXPECT_EQ(EncodeFloat16(65520.0), 0x7C00);  // ties to even: infinity
  EXPECT_EQ(EncodeFloat16(0x1p-24), 0x0001);  // smallest subnormal
  EXPECT_EQ(EncodeFloat16(0x1p-25), 0x0000);  // tie to even: zero
  EXPECT_EQ(EncodeFloat16(3 * 0x1p-25), 0x0002);
  EXPECT_EQ(EncodeFloat16(0x1p-14), 0x0400);  // smallest normal
  EXPECT_EQ(EncodeFloat16(1.0 / 3.0), 0x3555);
  EXPECT_EQ(DecodeFloat16(0x3555), 0.333251953125);
  EXPECT_EQ(DecodeFloat16(0x03FF), 1023 * 0x1p-24);
  EXPECT_EQ(DecodeFloat16(0xFC00), -kInf);
  EXPECT_TRUE(std::isnan(DecodeFloat16(0x7E00)));
}

TEST(ReferenceSelf, EveryNonNan16BitPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const double bf = DecodeBFloat16(b);
    if (!std::isnan(bf)) {
      ASSERT_EQ(EncodeBFloat16(bf), b) << std::hex << bits;
      ASSERT_EQ(RoundToBFloat16(bf), bf);
    }
    const double hf = DecodeFloat16(b);
    if (!std::isnan(hf)) {
      ASSERT_EQ(EncodeFloat16(hf), b) << std::hex << bits;
      ASSERT_EQ(RoundToFloat16(hf), hf);
    }
  }
}

RefProblem OneRow(std::vector<double> weights, std::vector<double> scores) {
  RefProblem pr;
  pr.B = 1;
  pr.T = 1;
  pr.S = static_cast<int64_t>(scores.size());
  pr.weights = std::move(weights);
  pr.scores = std::move(scores);
  pr.reduction = RefReduction::kSum;
  return pr;
}

TEST(ReferenceSelf, HandComputedExactLoss) {
  // p = (1/2, 1/2), q = (1/4, 3/4).
  const RefResult r = ComputeReference(OneRow({1, 1}, {0, std::log(3.0)}));
  ASSERT_EQ(r.error, "");
  const double kl = 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0);
  EXPECT_NEAR(r.loss, kl, 1e-15);
  EXPECT_NEAR(r.grad[0], -0.25, 1e-15);
  EXPECT_NEAR(r.grad[1], 0.25, 1e-15);
  EXPECT_NEAR(r.mean_entropy_p, std::log(2.0), 1e-15);
  EXPECT_NEAR(r.mean_entropy_q,
              -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-15);
  EXPECT_EQ(r.denominator, 1);
  EXPECT_EQ(r.rows_counted, 1);
}

TEST(ReferenceSelf, HandComputedPerHeadTargetIsTheMeanOfSoftmaxes) {
  RefProblem pr = OneRow({}, {0, 0});
  pr.H = 2;
  pr.logits = {0, 0, 0, std::log(3.0)};  // heads (1/2,1/2) and (1/4,3/4)
  const RefResult r = ComputeReference(pr);
  ASSERT_EQ(r.error, "");
  EXPECT_NEAR(r.p[0], 0.375, 1e-15);
  EXPECT_NEAR(r.p[1], 0.625, 1e-15);
  const double kl = 0.375 * std::log(0.375 / 0.5) + 0.625 * std::log(1.25);
  EXPECT_NEAR(r.loss, kl, 1e-15);
}

TEST(ReferenceSelf, HandComputedMaxTextLoss) {
  RefProblem pr = OneRow({1, 3}, {0, 0});
  pr.flavor = RefFlavor::kMaxText;
  const RefResult r = ComputeReference(pr);
  ASSERT_EQ(r.error, "");
  const double p0 = 1 / (4 + 1e-8), p1 = 3 / (4 + 1e-8);
  const double kl = p0 * (std::log(p0 + 1e-8) - std::log(0.5 + 1e-8)) +
                    p1 * (std::log(p1 + 1e-8) - std::log(0.5 + 1e-8));
  EXPECT_NEAR(r.loss, kl, 1e-15);
  const double g0 = -p0 / (0.5 + 1e-8), g1 = -p1 / (0.5 + 1e-8);
  const double qg = 0.5 * g0 + 0.5 * g1;
  EXPECT_NEAR(r.grad[0], 0.5 * (g0 - qg), 1e-15);
  EXPECT_NEAR(r.grad[1], 0.5 * (g1 - qg), 1e-15);
}

TEST(ReferenceSelf, HandComputedRecall) {
  // Scores rank keys 2, 0, 1; p = (0.1, 0.2, 0.7).
  RefProblem pr = OneRow({1, 2, 7}, {1, 0, 2});
  for (auto [k, want] : {std::pair{1, 0.7}, {2, 0.8}, {3, 1.0}, {9, 1.0}}) {
    pr.recall_k = k;
    EXPECT_NEAR(ComputeReference(pr).topk_recall, want, 1e-15) << k;
  }
}

TEST(ReferenceSelf, MasksAndReductions) {
  // T = 2, S = 2, causal with the default offset: row 0 sees key 0 only.
  RefProblem pr;
  pr.B = 1;
  pr.T = 2;
  pr.S = 2;
  pr.weights = {1, 5, 1, 1};
  pr.scores = {3, 7, 0, std::log(3.0)};
  pr.causal = true;
  pr.reduction = RefReduction::kMean;
  RefResult r = ComputeReference(pr);
  ASSERT_EQ(r.error, "");
  const double kl1 = 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0);
  EXPECT_NEAR(r.row_kl[0], 0.0, 1e-15);  // one key: p = q = 1
  EXPECT_NEAR(r.loss, kl1 / 2, 1e-15);
  EXPECT_EQ(r.grad[1], 0.0);  // masked key
  pr.row_valid = {1, 0};
  pr.reduction = RefReduction::kMeanValid;
  r = ComputeReference(pr);
  EXPECT_EQ(r.denominator, 1);
  EXPECT_NEAR(r.loss, 0.0, 1e-15);
  EXPECT_EQ(r.grad[3], 0.0);
  pr.row_valid.clear();
  pr.q_offset = -1;  // row 0 sees nothing, row 1 sees key 0
  r = ComputeReference(pr);
  EXPECT_EQ(r.rows_fully_masked, 1);
  EXPECT_EQ(r.denominator, 1);
}

TEST(ReferenceSelf, ReportsBadTensors) {
  EXPECT_EQ(ComputeReference(OneRow({1, -1}, {0, 0})).error,
            "attention_weights");
  EXPECT_EQ(ComputeReference(OneRow({1, 1}, {0, kInf})).error,
            "indexer_scores");
  EXPECT_EQ(ComputeReference(OneRow({1, 1}, {0, -kInf})).error,
            "indexer_scores");
  EXPECT_EQ(ComputeReference(OneRow({1, 0}, {0, -kInf})).error, "");
  RefProblem pr = OneRow({1, 1}, {0, -kInf});
  pr.flavor = RefFlavor::kMaxText;
  EXPECT_EQ(ComputeReference(pr).error, "");
}

}  // namespace
}  // namespace klref
