#include "tests/kernels/test_backends.h"

#include <memory>

#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/test_data.h"
#if KLSERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace klserve::testdata {
namespace {

// Set by a running BackendTest (GoogleTest runs one test at a time).
Backend* backend_under_test = nullptr;

}  // namespace

Backend* TestBackend(const std::string& name, std::string* why) {
  if (name == "cpu") return &SharedBackend();
  if (name == "cuda") {
#if KLSERVE_HAVE_CUDA
    static const absl::StatusOr<std::unique_ptr<Backend>>* cuda =
        new absl::StatusOr<std::unique_ptr<Backend>>(CreateCudaBackend(0));
    if (cuda->ok()) return cuda->value().get();
    *why = "CUDA backend not tested: " + std::string(cuda->status().message());
#else
    *why = "CUDA backend not tested: this build has none (no nvcc)";
#endif
    return nullptr;
  }
  *why = "unknown backend " + name;
  return nullptr;
}

Backend& BackendUnderTest() {
  return backend_under_test != nullptr ? *backend_under_test : SharedBackend();
}

void BackendTest::SetUp() {
  std::string why;
  backend_ = TestBackend(GetParam(), &why);
  if (backend_ == nullptr) GTEST_SKIP() << why;
  backend_under_test = backend_;
}

void BackendTest::TearDown() { backend_under_test = nullptr; }

std::string BackendName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace klserve::testdata
