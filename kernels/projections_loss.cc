#include "kernels/projections_loss.h"

#include <utility>

#include "kernels/projections_computation.h"
#include "kernels/status_macros.h"

namespace klserve {

absl::StatusOr<IndexerKlResult> ComputeProjectionsLoss(
    Backend& backend, const ProjectionsProblem& problem,
    const ProjectionsRowData& rows, const ProjectionsOutputs& outputs,
    StopCheck stop) {
  ASSIGN_OR_RETURN(
      ProjectionsComputation computation,
      ProjectionsComputation::Create(backend, problem, std::move(stop)));
  if (computation.needs_counting()) RETURN_IF_ERROR(computation.Count(rows));
  RETURN_IF_ERROR(
      computation.Compute({0, problem.num_rows()}, rows, outputs.rows)
          .status());
  return computation.Finish(outputs.d_index_key);
}

}  // namespace klserve
