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

// Row r's device error as its INVALID_ARGUMENT status from the row-error
// catalogue (kernels/value_errors.h), the offending value read from the host
// input `data`; OK when the row has none.
absl::Status RowErrorStatus(const IndexerKlProblem& problem,
                            const RowData& data, int64_t r,
                            const DeviceRowResult& row);

// The error of the lowest row among `results`, which hold rows first_row,
// first_row + 1, ...; OK when none failed.
absl::Status FirstRowError(const IndexerKlProblem& problem, const RowData& data,
                           int64_t first_row,
                           absl::Span<const DeviceRowResult> results);

// Folds `results` (rows first_row, first_row + 1, ...) as the CPU backend
// folds its rows (kernels/fold_rows.h), writing row_kl when not null.
void FoldRows(const IndexerKlProblem& problem, int64_t first_row,
              absl::Span<const DeviceRowResult> results, double* row_kl,
              LossAccumulator& accumulator);

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_FOLD_H_
