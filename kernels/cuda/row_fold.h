#ifndef KLSERVE_KERNELS_CUDA_ROW_FOLD_H_
#define KLSERVE_KERNELS_CUDA_ROW_FOLD_H_

// Host side of the row results the device sends back: the error of the
// lowest failing row, worded as the CPU backend words it, and the in-order
// fold of the rows into a LossAccumulator. Plain C++ (no CUDA).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cuda/device_row_result.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"

namespace klserve::cuda {

// Row r's device error as the CPU backend's INVALID_ARGUMENT status, the
// offending value read from the host input `data`; OK when the row has none.
absl::Status RowErrorStatus(const IndexerKlProblem& problem,
                            const RowData& data, int64_t r,
                            const DeviceRowResult& row);

// The error of the lowest row among `results`, which hold rows first_row,
// first_row + 1, ...; OK when none failed.
absl::Status FirstRowError(const IndexerKlProblem& problem, const RowData& data,
                           int64_t first_row,
                           absl::Span<const DeviceRowResult> results);

// Folds `results` (rows first_row, first_row + 1, ...) in row order into
// `accumulator`, as the CPU backend does, and writes row_kl[i] (when not
// null): the row's KL if it counts and has one, else 0.
void FoldRows(const IndexerKlProblem& problem, int64_t first_row,
              absl::Span<const DeviceRowResult> results, double* row_kl,
              LossAccumulator& accumulator);

// Whether row r counts (row_valid true or absent).
inline bool RowCounts(const IndexerKlProblem& problem, int64_t r) {
  return problem.row_valid == nullptr || problem.row_valid[r] != std::byte{0};
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_FOLD_H_
