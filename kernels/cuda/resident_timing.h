#ifndef KLSERVE_KERNELS_CUDA_RESIDENT_TIMING_H_
#define KLSERVE_KERNELS_CUDA_RESIDENT_TIMING_H_

// Device-side timings for the GPU benchmark (scripts/gpu-check.sh): what the
// kernel does with its data already on the device, and the device's own copy
// bandwidth to set it against. No CUDA types in this header.

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/problem.h"

namespace klserve::cuda {

// Bytes per second of a device-to-device copy of `bytes` (read plus write
// counted), best of `repetitions`, timed with events.
absl::StatusOr<double> DeviceCopyBytesPerSecond(int64_t bytes, int repetitions);

// Seconds per launch of the row kernel over all rows of `problem` (B = 1,
// whole tensors in `rows`, from WholeRowData), with its inputs uploaded once
// and the gradient written to the device in grad_dtype; best of
// `repetitions`.
absl::StatusOr<double> ResidentKernelSeconds(const IndexerKlProblem& problem,
                                             const RowData& rows,
                                             int repetitions);

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_RESIDENT_TIMING_H_
