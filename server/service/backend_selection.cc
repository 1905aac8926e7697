#include "server/service/backend_selection.h"

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/status_macros.h"
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

std::unique_ptr<Backend> Cpu(int threads, cpu::Isa isa, bool forced) {
  std::fprintf(stderr, "klserve: CPU kernels: %s (%s)\n",
               std::string(cpu::IsaName(isa)).c_str(),
               forced ? "--isa" : "the best this CPU runs");
  return std::make_unique<CpuBackend>(threads, isa);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> SelectBackend(absl::string_view name,
                                                       int threads,
                                                       absl::string_view isa) {
  ASSIGN_OR_RETURN(const cpu::Isa cpu_isa, cpu::ResolveIsa(isa, "--isa"));
  const bool forced = isa != "auto";
  if (name == "cpu") return Cpu(threads, cpu_isa, forced);
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
  return Cpu(threads, cpu_isa, forced);
}

}  // namespace klserve::server
