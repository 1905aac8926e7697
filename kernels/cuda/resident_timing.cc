#include "kernels/cuda/resident_timing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/copy_plan.h"
#include "kernels/cuda/device_buffers.h"
#include "kernels/cuda/row_kernel.h"
#include "kernels/cuda/row_pipeline.h"
#include "kernels/loss.h"
#include "kernels/status_macros.h"

namespace klserve::cuda {
namespace {

// Events around `launch`, best of `repetitions`, after one warm-up.
template <typename Launch>
absl::StatusOr<double> BestSeconds(int repetitions, Launch launch) {
  cudaEvent_t start, stop;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  absl::Status status = CudaStatus(launch(), "warm-up");
  float best_ms = 1e30f;
  for (int i = 0; i < repetitions && status.ok(); ++i) {
    cudaEventRecord(start);
    status = CudaStatus(launch(), "launch");
    cudaEventRecord(stop);
    if (status.ok()) {
      status = CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize");
    }
    float ms = 0;
    if (status.ok()) cudaEventElapsedTime(&ms, start, stop);
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  return best_ms / 1e3;
}

absl::Status Upload(DeviceBuffer& buffer, int64_t offset, const void* data,
                    int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy(buffer.data() + offset, data, bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy");
}

}  // namespace

absl::StatusOr<double> DeviceCopyBytesPerSecond(int64_t bytes,
                                                int repetitions) {
  DeviceBuffer from, to;
  RETURN_IF_ERROR(from.Reserve(bytes));
  RETURN_IF_ERROR(to.Reserve(bytes));
  ASSIGN_OR_RETURN(const double seconds, BestSeconds(repetitions, [&] {
                     return cudaMemcpyAsync(to.data(), from.data(), bytes,
                                            cudaMemcpyDeviceToDevice);
                   }));
  return 2.0 * static_cast<double>(bytes) / seconds;
}

absl::StatusOr<double> ResidentKernelSeconds(const IndexerKlProblem& p,
                                             int repetitions) {
  if (p.B != 1 || !p.rows.target.present() || p.has_attention_mask) {
    return absl::InvalidArgumentError(
        "ResidentKernelSeconds: needs B = 1, whole tensors, no "
        "attention_mask");
  }
  const int64_t n = p.T;
  const ChunkInputs in = LayoutChunkInputs(p, p.rows, n);
  const ChunkOutputs out = LayoutChunkOutputs(p, true, p.options.grad_dtype, n);
  const ChunkScratch scratch = LayoutChunkScratch(p, n);
  DeviceBuffer inputs, outputs, scratch_buffer;
  RETURN_IF_ERROR(inputs.Reserve(in.bytes));
  RETURN_IF_ERROR(outputs.Reserve(out.bytes));
  RETURN_IF_ERROR(scratch_buffer.Reserve(std::max<int64_t>(scratch.bytes, 1)));
  // With B = 1 a whole tensor is already in the chunk layout.
  const int64_t slots = n * p.row_length;
  RETURN_IF_ERROR(Upload(inputs, in.target, p.rows.target.data,
                         p.H * slots * DTypeSize(p.rows.target.dtype)));
  RETURN_IF_ERROR(Upload(inputs, in.scores, p.rows.scores.data,
                         slots * DTypeSize(p.rows.scores.dtype)));
  if (p.sparse()) {
    RETURN_IF_ERROR(Upload(inputs, in.indices, p.rows.indices.data,
                           slots * int64_t{sizeof(int32_t)}));
  }
  BlockOutputs block;
  block.grad_dtype = p.options.grad_dtype;
  block.grad_scale = GradScale(p, p.denominator.value_or(p.num_rows()));
  RowKernelParams params = ProblemKernelParams(p, p.rows, block);
  params.row_begin = 0;
  params.n = n;
  PointAtChunk(in, out, scratch, inputs.data(), outputs.data(),
               scratch_buffer.data(), /*with_mask=*/false, /*with_grad=*/true,
               params);
  return BestSeconds(repetitions,
                     [&] { return LaunchRowKernel(params, nullptr); });
}

}  // namespace klserve::cuda
