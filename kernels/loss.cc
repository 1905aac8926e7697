#include "kernels/loss.h"

#include "kernels/status_macros.h"

namespace klserve {

absl::StatusOr<IndexerKlResult> ComputeIndexerKl(
    Backend& backend, const IndexerKlProblem& problem, const RowData& rows,
    const LossOutputs& outputs) {
  LossComputation computation(backend, problem);
  const int64_t num_rows = problem.num_rows();
  if (computation.needs_counting()) {
    ASSIGN_OR_RETURN(const AdmittedBlock all,
                     computation.Admit(0, num_rows, /*counting=*/true));
    RETURN_IF_ERROR(computation.Compute(all, rows, LossOutputs()));
  }
  ASSIGN_OR_RETURN(const AdmittedBlock all,
                   computation.Admit(0, num_rows, /*counting=*/false));
  RETURN_IF_ERROR(computation.Compute(all, rows, outputs));
  return computation.Finish();
}

}  // namespace klserve
