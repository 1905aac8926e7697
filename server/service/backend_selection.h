#ifndef KLSERVE_SERVER_SERVICE_BACKEND_SELECTION_H_
#define KLSERVE_SERVER_SERVICE_BACKEND_SELECTION_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/problem.h"

namespace klserve::server {

// The backends a server computes with: the one --backend named and, under
// --backend=auto on a CUDA device, a CPU backend for the problems the CUDA
// backend refuses as UNIMPLEMENTED (per-row key bounds, the projections
// form), so that `auto` serves every request. --backend=cuda keeps the
// refusal: it asks for the GPU alone.
class ServingBackends {
 public:
  ServingBackends(std::unique_ptr<Backend> primary,
                  std::unique_ptr<Backend> cpu_fallback)
      : primary_(std::move(primary)), cpu_fallback_(std::move(cpu_fallback)) {}

  // The backend --backend named (GetServerInfo and the metrics report it).
  Backend& primary() const { return *primary_; }
  // The backend that computes `problem` of the logits form.
  Backend& For(const IndexerKlProblem& problem) const;
  // The backend that computes problems of the projections form.
  Backend& ForProjections() const;

 private:
  std::unique_ptr<Backend> primary_;
  std::unique_ptr<Backend> cpu_fallback_;  // null unless auto chose CUDA
};

// The backends named by --backend: "cpu", "cuda", or "auto" (CUDA when this
// build has it and a device is usable, with a CPU backend beside it for what
// CUDA does not serve; otherwise the CPU with one log line). "cuda" without
// a usable device is an error, so a misconfigured GPU node fails at start
// rather than running slowly. `isa` (--isa) picks the CPU kernels' variant
// and is checked whatever the backend, so that a word this CPU cannot run
// fails at start on every node; the CPU backend logs the variant it runs.
absl::StatusOr<std::unique_ptr<ServingBackends>> SelectBackends(
    absl::string_view name, int threads, absl::string_view isa);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_BACKEND_SELECTION_H_
