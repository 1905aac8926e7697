#include "tests/kernels/test_backends.h"

#include <memory>

#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/test_data.h"
#if KLSERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace klserve::testdata {

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

}  // namespace klserve::testdata
