#ifndef KLSERVE_KERNELS_CUDA_ROW_PIPELINE_H_
#define KLSERVE_KERNELS_CUDA_ROW_PIPELINE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/copy_plan.h"
#include "kernels/cuda/device_buffers.h"
#include "kernels/cuda/device_row_result.h"
#include "kernels/cuda/row_kernel.h"
#include "kernels/problem.h"

namespace klserve::cuda {

// Moves a block of rows through the device in chunks: the host packs chunk
// c's inputs into a pinned buffer while the device copies and computes chunk
// c - 1, then unpacks chunk c - 1's gradient while the device works on c.
// Owns one stream and grow-only buffers (two pinned input and output
// stagings, device inputs, outputs and scratch), reused across calls. One
// call at a time; the backend lends each concurrent call its own pipeline.
// The kernel parameters every chunk of `problem` shares (no pointers yet).
RowKernelParams ProblemKernelParams(const IndexerKlProblem& problem,
                                    const RowData& data,
                                    const BlockOutputs& outputs);

// Points `params` (whose `sparse` is set) at a chunk laid out by
// LayoutChunkInputs/Outputs/Scratch in the given device buffers.
void PointAtChunk(const ChunkInputs& in, const ChunkOutputs& out,
                  const ChunkScratch& scratch, std::byte* d_in,
                  std::byte* d_out, std::byte* d_scratch, bool with_mask,
                  bool with_grad, RowKernelParams& params);

class RowPipeline {
 public:
  // Bytes of input and output one staging buffer holds (at least one row).
  static constexpr int64_t kStagingBudget = int64_t{64} << 20;

  // A pipeline on the current device.
  static absl::StatusOr<std::unique_ptr<RowPipeline>> Create();
  RowPipeline(const RowPipeline&) = delete;
  RowPipeline& operator=(const RowPipeline&) = delete;
  ~RowPipeline();

  // Computes rows `rows` of `problem` from the host tensors `data`: writes
  // their gradient rows to outputs.grad (when not null) and one result per
  // row, in row order, to `results`. Stops after the first chunk that holds
  // a row error, so `results` may cover only the first rows; the device is
  // idle again on return. Errors are the CUDA runtime's (INTERNAL,
  // RESOURCE_EXHAUSTED); row errors are in `results`.
  absl::Status Run(const IndexerKlProblem& problem, const RowData& data,
                   RowRange rows, const BlockOutputs& outputs,
                   std::vector<DeviceRowResult>& results);

 private:
  RowPipeline() = default;

  // Copies the per-batch tensors of the batches of `rows` to the device and
  // points `params` at them.
  absl::Status UploadBatchTensors(const IndexerKlProblem& problem,
                                  RowRange rows, RowKernelParams& params);
  // Launches chunk `chunk` from staging slot `slot`.
  absl::Status StartChunk(const IndexerKlProblem& problem, const RowData& data,
                          RowRange chunk, const BlockOutputs& outputs, int slot,
                          RowKernelParams params);
  // Waits for chunk `chunk` of slot `slot`, appends its results and writes
  // its gradient rows; sets `row_error` when a row failed.
  absl::Status FinishChunk(const IndexerKlProblem& problem, RowRange chunk,
                           const BlockOutputs& outputs, int slot,
                           std::vector<DeviceRowResult>& results,
                           bool& row_error);

  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_[2] = {nullptr, nullptr};
  PinnedBuffer staged_inputs_[2];
  PinnedBuffer staged_outputs_[2];
  DeviceBuffer inputs_;
  DeviceBuffer outputs_;
  DeviceBuffer scratch_;
  DeviceBuffer batch_tensors_;
};

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_PIPELINE_H_
