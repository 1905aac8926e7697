#include "kernels/fold_rows.h"

namespace klserve {

void FoldRows(const IndexerKlProblem& problem, int64_t first_row,
              absl::Span<const RowResult> results, double* row_kl,
              LossAccumulator& accumulator) {
  for (size_t i = 0; i < results.size(); ++i) {
    const RowResult& row = results[i];
    const bool counts = problem.row_counts(first_row + static_cast<int64_t>(i));
    accumulator.Add(row, counts);
    if (row_kl != nullptr) {
      row_kl[i] =
          counts && row.kind == RowResult::Kind::kComputed ? row.kl : 0.0;
    }
  }
}

}  // namespace klserve
