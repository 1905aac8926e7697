#ifndef KLSERVE_CLIENT_KERNEL_LOAD_H_
#define KLSERVE_CLIENT_KERNEL_LOAD_H_

// klctl bench --kernel: the bench's problem computed in this process by the
// CPU kernels, the floor any transport adds to. Part of klctl only: the
// client library does not link the math library.

#include "client/bench_load.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve {

// Computes `request` (every tensor inline; either form) through the
// kernels' whole-problem entry point (ComputeIndexerKl, or
// ComputeProjectionsLoss for the projections form) on a CPU backend of
// `threads` threads, from `limits.concurrency` workers sharing it, as a
// server of that many threads does. Each call checks the problem as the
// server does (Problem::Create) and writes its outputs to buffers made once
// per worker. Bytes are counted as RunLossLoad counts them.
LoadResult RunKernelLoad(const v1::ComputeLossRequest& request, int threads,
                         const LoadLimits& limits);

}  // namespace klserve

#endif  // KLSERVE_CLIENT_KERNEL_LOAD_H_
