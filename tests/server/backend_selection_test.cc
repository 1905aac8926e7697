// Which backend computes a problem: --backend's, except that a CPU backend
// kept beside the CUDA one (--backend=auto) takes what CUDA refuses.

#include "server/service/backend_selection.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace klserve::server {
namespace {

// A dense head-aggregated problem of B = 1, T = 2, S = 3, with key bounds
// or without.
IndexerKlProblem Problem(bool key_bounds) {
  static const std::vector<float> values(6, 1.0f);
  static const std::vector<int32_t> start = {0, 1}, end = {1, 3};
  const auto view = [](DType dtype, std::initializer_list<int64_t> shape,
                       const void* data, int64_t bytes) {
    TensorView v;
    v.dtype = dtype;
    v.shape.assign(shape.begin(), shape.end());
    v.data = data;
    v.byte_size = bytes;
    return v;
  };
  IndexerKlInputs in;
  in.attention_weights = view(DType::kFloat32, {1, 2, 3}, values.data(), 24);
  in.indexer_scores = view(DType::kFloat32, {1, 2, 3}, values.data(), 24);
  if (key_bounds) {
    in.key_start = view(DType::kInt32, {1, 2}, start.data(), 8);
    in.key_end = view(DType::kInt32, {1, 2}, end.data(), 8);
  }
  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(in, IndexerKlOptions());
  EXPECT_TRUE(problem.ok()) << problem.status();
  return *std::move(problem);
}

TEST(ServingBackends, TheFallbackTakesKeyBoundsAndTheProjectionsForm) {
  auto primary = std::make_unique<CpuBackend>(1);
  auto fallback = std::make_unique<CpuBackend>(1);
  const Backend* primary_ptr = primary.get();
  const Backend* fallback_ptr = fallback.get();
  const ServingBackends backends(std::move(primary), std::move(fallback));
  EXPECT_EQ(&backends.primary(), primary_ptr);
  EXPECT_EQ(&backends.For(Problem(/*key_bounds=*/false)), primary_ptr);
  EXPECT_EQ(&backends.For(Problem(/*key_bounds=*/true)), fallback_ptr);
  EXPECT_EQ(&backends.ForProjections(), fallback_ptr);
}

TEST(ServingBackends, WithoutAFallbackThePrimaryTakesEverything) {
  absl::StatusOr<std::unique_ptr<ServingBackends>> backends =
      SelectBackends("cpu", 1, "auto");
  ASSERT_TRUE(backends.ok()) << backends.status();
  Backend& primary = (*backends)->primary();
  EXPECT_EQ(primary.name(), "cpu");
  EXPECT_EQ(&(*backends)->For(Problem(/*key_bounds=*/true)), &primary);
  EXPECT_EQ(&(*backends)->ForProjections(), &primary);
}

TEST(ServingBackends, UnknownBackendNamesTheFlag) {
  absl::StatusOr<std::unique_ptr<ServingBackends>> backends =
      SelectBackends("tpu", 1, "auto");
  ASSERT_EQ(backends.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backends.status().message().rfind("--backend:", 0), 0u)
      << backends.status();
}

}  // namespace
}  // namespace klserve::server
