// The CUDA backend against the CPU backend on the same random inputs: the
// two must agree to float32 rounding on every output, and give the same
// errors. Skipped, with the reason, where no CUDA device is usable.

#include <cmath>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"

namespace klserve::testdata {
namespace {

TEST(BackendCrossCheck, CudaMatchesCpuOnRandomProblems) {
  std::string why;
  Backend* cuda = TestBackend("cuda", &why);
  if (cuda == nullptr) GTEST_SKIP() << why;
  Backend* cpu = TestBackend("cpu", &why);
  std::mt19937_64 rng(20261130);
  for (uint64_t i = 0; i < 200; ++i) {
    const CaseSpec spec = RandomSpec(rng);
    SCOPED_TRACE(Describe(spec) + " seed=" + std::to_string(i));
    const Case c = MakeRandomCase(spec, 5000 + i);
    const LibOutput a = RunLibrary(c, cpu);
    const LibOutput b = RunLibrary(c, cuda);
    ASSERT_EQ(a.status.code(), b.status.code())
        << a.status << " vs " << b.status;
    if (!a.status.ok()) {
      EXPECT_EQ(a.status.message(), b.status.message());
      continue;
    }
    const double scale = std::max(1.0, std::fabs(a.result.loss));
    EXPECT_NEAR(a.result.loss, b.result.loss, 1e-5 * scale);
    EXPECT_NEAR(a.result.unscaled_loss, b.result.unscaled_loss,
                1e-5 * std::max(1.0, std::fabs(a.result.unscaled_loss)));
    EXPECT_EQ(a.result.denominator, b.result.denominator);
    EXPECT_EQ(a.result.rows_counted, b.result.rows_counted);
    EXPECT_EQ(a.result.rows_fully_masked, b.result.rows_fully_masked);
    EXPECT_EQ(a.result.rows_zero_target, b.result.rows_zero_target);
    ASSERT_EQ(a.grad.size(), b.grad.size());
    double max_grad = 0;
    for (double g : a.grad) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t j = 0; j < a.grad.size(); ++j) {
      ASSERT_NEAR(a.grad[j], b.grad[j], 1e-4 * max_grad + 1e-12) << j;
    }
  }
}

TEST(BackendCrossCheck, CudaIsDeterministic) {
  std::string why;
  Backend* cuda = TestBackend("cuda", &why);
  if (cuda == nullptr) GTEST_SKIP() << why;
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < 20; ++i) {
    const Case c = MakeRandomCase(RandomSpec(rng), 9000 + i);
    const LibOutput a = RunLibrary(c, cuda);
    const LibOutput b = RunLibrary(c, cuda);
    ASSERT_EQ(a.status.ok(), b.status.ok());
    if (!a.status.ok()) continue;
    EXPECT_EQ(a.result.loss, b.result.loss);  // the same bits
    EXPECT_EQ(a.grad_bytes, b.grad_bytes);
  }
}

}  // namespace
}  // namespace klserve::testdata
