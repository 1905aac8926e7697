#include "kernels/loss.h"

#include "kernels/status_macros.h"

namespace klserve {

absl::StatusOr<IndexerKlResult> ComputeIndexerKl(
    Backend& backend, const IndexerKlProblem& problem,
    const LossOutputs& outputs) {
  LossComputation computation(backend, problem);
  const int64_t rows = problem.num_rows();
  if (computation.needs_counting()) {
    ASSIGN_OR_RETURN(const AdmittedBlock all,
                     computation.Admit(0, rows, /*counting=*/true));
    RETURN_IF_ERROR(computation.Compute(all, problem.rows, LossOutputs()));
  }
  ASSIGN_OR_RETURN(const AdmittedBlock all,
                   computation.Admit(0, rows, /*counting=*/false));
  RETURN_IF_ERROR(computation.Compute(all, problem.rows, outputs));
  return computation.Finish();
}

}  // namespace klserve
