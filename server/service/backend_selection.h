#ifndef KLSERVE_SERVER_SERVICE_BACKEND_SELECTION_H_
#define KLSERVE_SERVER_SERVICE_BACKEND_SELECTION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace klserve::server {

// The backend named by --backend: "cpu", "cuda", or "auto" (CUDA when this
// build has it and a device is usable, otherwise the CPU with one log line).
// "cuda" without a usable device is an error, so a misconfigured GPU node
// fails at start rather than running slowly. `isa` (--isa) picks the CPU
// kernels' variant and is checked whatever the backend, so that a word this
// CPU cannot run fails at start on every node; the CPU backend logs the
// variant it runs.
absl::StatusOr<std::unique_ptr<Backend>> SelectBackend(absl::string_view name,
                                                       int threads,
                                                       absl::string_view isa);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_BACKEND_SELECTION_H_
