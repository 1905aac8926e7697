#include "server/backend_selection.h"

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#if KLSERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace klserve::server {
namespace {

// The CUDA backend, or why there is none here.
absl::StatusOr<std::unique_ptr<Backend>> Cuda() {
#if KLSERVE_HAVE_CUDA
  return CreateCudaBackend(0);
#else
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> SelectBackend(absl::string_view name,
                                                       int threads) {
  if (name == "cpu") return std::make_unique<CpuBackend>(threads);
  if (name != "cuda" && name != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend: must be auto, cpu or cuda, got \"", name, "\""));
  }
  absl::StatusOr<std::unique_ptr<Backend>> cuda = Cuda();
  if (cuda.ok()) return cuda;
  if (name == "cuda") {
    return absl::FailedPreconditionError(
        absl::StrCat("--backend=cuda: ", cuda.status().message()));
  }
  std::fprintf(stderr, "klserve: no usable CUDA device (%s); using the CPU\n",
               std::string(cuda.status().message()).c_str());
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace klserve::server
