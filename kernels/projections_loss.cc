#include "kernels/projections_loss.h"

#include <utility>

#include "absl/status/status.h"
#include "kernels/projections_computation.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

absl::Status CheckOutputs(const ProjectionsProblem& p,
                          const ProjectionsOutputs& out) {
  const IndexerKlOptions& options = p.logits.options;
  if (options.want_grad &&
      (out.d_index_query == nullptr || out.d_index_key == nullptr ||
       out.d_index_weights == nullptr)) {
    return absl::InvalidArgumentError(
        "d_index_query, d_index_key, d_index_weights: output buffers are "
        "required for the gradient");
  }
  if (options.want_row_kl && out.row_kl == nullptr) {
    return absl::InvalidArgumentError("row_kl: an output buffer is required");
  }
  if (p.server_topk && out.topk_indices == nullptr) {
    return absl::InvalidArgumentError(
        "topk_indices: an output buffer is required for the selection");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IndexerKlResult> ComputeProjectionsLoss(
    Backend& backend, const ProjectionsProblem& problem,
    const ProjectionsRowData& rows, const ProjectionsOutputs& outputs,
    StopCheck stop) {
  RETURN_IF_ERROR(CheckOutputs(problem, outputs));
  ASSIGN_OR_RETURN(
      ProjectionsComputation computation,
      ProjectionsComputation::Create(backend, problem, std::move(stop)));
  if (computation.needs_counting()) RETURN_IF_ERROR(computation.Count(rows));
  const ProjectionsBlockOutputs all{.d_index_query = outputs.d_index_query,
                                    .d_index_weights = outputs.d_index_weights,
                                    .topk_indices = outputs.topk_indices,
                                    .row_kl = outputs.row_kl,
                                    .capacity_rows = problem.num_rows()};
  RETURN_IF_ERROR(
      computation.Compute({0, problem.num_rows()}, rows, all).status());
  return computation.Finish(outputs.d_index_key);
}

}  // namespace klserve
