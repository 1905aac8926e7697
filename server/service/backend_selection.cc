#include "server/service/backend_selection.h"

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/blas.h"
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
  auto backend = std::make_unique<CpuBackend>(threads, isa);
  // Which kernels the projections form's products run (docs/blas.md), or why
  // that form is refused.
  std::fprintf(stderr, "klserve: projections form: %s\n",
               cpu::BlasKernels().c_str());
  return backend;
}

}  // namespace

Backend& ServingBackends::For(const IndexerKlProblem& problem) const {
  // The CUDA kernels know no key bounds (kernels/cuda/cuda_backend.cc).
  if (cpu_fallback_ != nullptr && problem.key_start != nullptr) {
    return *cpu_fallback_;
  }
  return *primary_;
}

Backend& ServingBackends::ForProjections() const {
  return cpu_fallback_ != nullptr ? *cpu_fallback_ : *primary_;
}

absl::StatusOr<std::unique_ptr<ServingBackends>> SelectBackends(
    absl::string_view name, int threads, absl::string_view isa) {
  ASSIGN_OR_RETURN(const cpu::Isa cpu_isa, cpu::ResolveIsa(isa, "--isa"));
  const bool forced = isa != "auto";
  const auto cpu_only = [&] {
    return std::make_unique<ServingBackends>(Cpu(threads, cpu_isa, forced),
                                             nullptr);
  };
  if (name == "cpu") return cpu_only();
  if (name != "cuda" && name != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend: must be auto, cpu or cuda, got \"", name, "\""));
  }
  absl::StatusOr<std::unique_ptr<Backend>> cuda = Cuda();
  if (cuda.ok()) {
    if (name == "cuda") {
      return std::make_unique<ServingBackends>(*std::move(cuda), nullptr);
    }
    std::fprintf(stderr,
                 "klserve: the CPU computes what the CUDA backend does not "
                 "serve (per-row key bounds, the projections form)\n");
    return std::make_unique<ServingBackends>(*std::move(cuda),
                                             Cpu(threads, cpu_isa, forced));
  }
  if (name == "cuda") {
    return absl::FailedPreconditionError(
        absl::StrCat("--backend=cuda: ", cuda.status().message()));
  }
  std::fprintf(stderr, "klserve: no usable CUDA device (%s); using the CPU\n",
               std::string(cuda.status().message()).c_str());
  return cpu_only();
}

}  // namespace klserve::server
