#ifndef KLSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define KLSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

// The CUDA backend. This header includes no CUDA header: the server and the
// tests include it in builds that have the klserve_cuda library, whichever
// machine they run on.

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace klserve {

// A backend computing on device `device_ordinal`: same results as the CPU
// backend to float32 rounding, the same errors with the same messages, and
// bit-identical results from run to run. Its name() is "cuda", device() says
// "<GPU name>, sm_XY, N GiB", threads() is 1 (the calling thread stages the
// data). ComputeRows may be called from several threads at once; each call
// gets its own stream and buffers, kept for reuse.
//
// FAILED_PRECONDITION when no device is usable (no driver or GPU, or CUDA's
// reason), the ordinal does not exist, or this build has no code for the
// device.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    int device_ordinal = 0);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
