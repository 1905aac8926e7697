#ifndef KLSERVE_KERNELS_PROJECTIONS_LOSS_H_
#define KLSERVE_KERNELS_PROJECTIONS_LOSS_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/loss_computation.h"
#include "kernels/projections_computation.h"
#include "kernels/projections_problem.h"

// The projections form's whole-problem entry point: a ProjectionsComputation
// fed all query rows as one block.

namespace klserve {

// Caller-owned outputs of a whole problem: each per-row output the problem
// asks for over all B*T rows (ProjectionsRowOutputTensors; capacity_rows at
// least B*T), and with the gradients d_index_key, [B,S,D_I] in the gradient
// dtype (ProjectionsProblem::key_gradient_shape).
struct ProjectionsOutputs {
  ProjectionsBlockOutputs rows;
  std::byte* d_index_key = nullptr;
};

// Computes the loss of the projections form, its row KL and diagnostics, the
// gradients of index_query, index_key and index_weights and, when the service
// selects, the top-k indices, into `outputs`, from the query rows `rows`
// (WholeProjectionsRows). Value errors are INVALID_ARGUMENT naming the tensor
// and the first bad position; the outputs then hold partial results. A
// backend that does not compute this form answers UNIMPLEMENTED. `stop`,
// when given, is asked between the steps of each tile, and a status it
// returns ends the computation (ProjectionsComputation). Thread-safe for
// concurrent calls on one backend.
absl::StatusOr<IndexerKlResult> ComputeProjectionsLoss(
    Backend& backend, const ProjectionsProblem& problem,
    const ProjectionsRowData& rows, const ProjectionsOutputs& outputs,
    StopCheck stop = nullptr);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_PROJECTIONS_LOSS_H_
