#ifndef KLSERVE_KERNELS_FOLD_ROWS_H_
#define KLSERVE_KERNELS_FOLD_ROWS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"

namespace klserve {

// Folds the results of rows first_row, first_row + 1, ... in row order into
// `accumulator`, whichever backend computed them and in whatever order: the
// totals then do not depend on how the rows were split. Writes row_kl[i]
// (when not null): the row's KL if it counts and has one, else 0.
void FoldRows(const IndexerKlProblem& problem, int64_t first_row,
              absl::Span<const RowResult> results, double* row_kl,
              LossAccumulator& accumulator);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_FOLD_ROWS_H_
