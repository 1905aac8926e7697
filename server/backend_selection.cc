#include "server/backend_selection.h"

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"

namespace klserve::server {

absl::StatusOr<std::unique_ptr<Backend>> SelectBackend(absl::string_view name,
                                                       int threads) {
  if (name == "cuda") {
    return absl::FailedPreconditionError(
        "--backend=cuda: this build has no CUDA backend");
  }
  if (name == "auto") {
    std::fprintf(stderr,
                 "klserve: no CUDA backend in this build; using the CPU\n");
  } else if (name != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend: must be auto, cpu or cuda, got \"", name, "\""));
  }
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace klserve::server
