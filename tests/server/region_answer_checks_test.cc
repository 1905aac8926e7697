// The checks of an answer computed from shared-memory inputs: each NaN or
// infinity the kernels could let through from a rewritten input is found
// and named, with the region; a finite answer passes.

#include "server/service/region_answer_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/match.h"

namespace klserve::server {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void ExpectRefused(const absl::Status& status, absl::string_view words) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), "region 'step': ")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), words)) << status;
}

IndexerKlResult FiniteResult() {
  IndexerKlResult result;
  result.loss = 0.25;
  result.unscaled_loss = 0.5;
  result.diagnostics = Diagnostics{
      .mean_entropy_p = 1.0, .mean_entropy_q = 2.0, .topk_recall = 0.75};
  return result;
}

TEST(CheckResultFinite, NamesTheFirstValueThatIsNot) {
  EXPECT_TRUE(CheckResultFinite("step", FiniteResult()).ok());
  IndexerKlResult result = FiniteResult();
  result.loss = kNaN;
  ExpectRefused(CheckResultFinite("step", result), "the loss came out nan");
  result = FiniteResult();
  result.unscaled_loss = -kInf;
  ExpectRefused(CheckResultFinite("step", result),
                "unscaled_loss came out -inf");
  result = FiniteResult();
  result.diagnostics->mean_entropy_p = kInf;
  ExpectRefused(CheckResultFinite("step", result),
                "diagnostics.mean_entropy_p came out inf");
  result = FiniteResult();
  result.diagnostics->mean_entropy_q = kNaN;
  ExpectRefused(CheckResultFinite("step", result),
                "diagnostics.mean_entropy_q");
  result = FiniteResult();
  result.diagnostics->topk_recall = kNaN;
  ExpectRefused(CheckResultFinite("step", result), "diagnostics.topk_recall");
  // Absent diagnostics are not checked.
  result = FiniteResult();
  result.diagnostics.reset();
  EXPECT_TRUE(CheckResultFinite("step", result).ok());
}

TEST(CheckGradientFinite, FindsANaNOrAnInfinityInEveryGradDtype) {
  std::vector<float> fp32(100, 1.5f);
  EXPECT_TRUE(
      CheckGradientFinite("step", DType::kFloat32, fp32.data(), fp32.size() * 4)
          .ok());
  fp32[97] = -std::numeric_limits<float>::infinity();
  ExpectRefused(CheckGradientFinite("step", DType::kFloat32, fp32.data(),
                                    fp32.size() * 4),
                "the gradient at element 97 came out NaN or infinite");
  // Half-precision bit patterns: 1.0, then +inf / NaN.
  std::vector<uint16_t> fp16(50, 0x3c00);
  EXPECT_TRUE(
      CheckGradientFinite("step", DType::kFloat16, fp16.data(), 100).ok());
  fp16[3] = 0x7c00;
  ExpectRefused(CheckGradientFinite("step", DType::kFloat16, fp16.data(), 100),
                "element 3");
  std::vector<uint16_t> bf16(50, 0x3f80);
  // The largest finite bfloat16 passes; a NaN does not.
  bf16[10] = 0x7f7f;
  EXPECT_TRUE(
      CheckGradientFinite("step", DType::kBFloat16, bf16.data(), 100).ok());
  bf16[49] = 0x7fc1;
  ExpectRefused(CheckGradientFinite("step", DType::kBFloat16, bf16.data(), 100),
                "element 49");
}

}  // namespace
}  // namespace klserve::server
