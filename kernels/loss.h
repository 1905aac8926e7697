#ifndef KLSERVE_KERNELS_LOSS_H_
#define KLSERVE_KERNELS_LOSS_H_

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/loss_computation.h"
#include "kernels/problem.h"

// The whole-problem entry point: a LossComputation fed all rows as one block.

namespace klserve {

// Computes the loss, the gradient and the diagnostics of `problem` from
// `rows` (WholeRowData), with `outputs` for all B*T rows. Value errors in the
// data (NaN, infinities, bad indices) come back as INVALID_ARGUMENT; the output
// buffers then hold partial results. Thread-safe for concurrent calls on one
// backend.
absl::StatusOr<IndexerKlResult> ComputeIndexerKl(
    Backend& backend, const IndexerKlProblem& problem, const RowData& rows,
    const LossOutputs& outputs);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_LOSS_H_
