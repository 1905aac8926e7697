#include "kernels/cuda/row_pipeline.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/cuda/copy_plan.h"
#include "kernels/status_macros.h"

namespace klserve::cuda {
namespace {

// Packs rows `chunk` of `view` (heads x width elements each) into `staged`
// at byte `offset`, laid out [heads, n, width].
void PackRows(const RowView& view, int64_t T, RowRange chunk, int64_t heads,
              int64_t width, std::byte* staged, int64_t offset) {
  for (const RowCopy& copy :
       PlanRowCopies(LayoutOf(view), T, chunk, heads, width)) {
    std::memcpy(staged + offset + copy.packed, view.data + copy.strided,
                copy.bytes);
  }
}

// Leaves the stream idle on every exit from Run: no copy or kernel may still
// use the buffers when the caller's data goes away or the next call starts.
class SyncOnExit {
 public:
  explicit SyncOnExit(cudaStream_t stream) : stream_(stream) {}
  ~SyncOnExit() { cudaStreamSynchronize(stream_); }

 private:
  cudaStream_t stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RowPipeline>> RowPipeline::Create() {
  std::unique_ptr<RowPipeline> pipeline(new RowPipeline());
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&pipeline->stream_, cudaStreamNonBlocking),
      "cudaStreamCreate"));
  for (cudaEvent_t& event : pipeline->done_) {
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                   "cudaEventCreate"));
  }
  return pipeline;
}

RowPipeline::~RowPipeline() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaEvent_t event : done_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status RowPipeline::UploadBatchTensors(const IndexerKlProblem& p,
                                             RowRange rows,
                                             RowKernelParams& params) {
  const int64_t b0 = rows.begin / p.T;
  const int64_t nb = (rows.end - 1) / p.T - b0 + 1;
  params.batch_begin = b0;
  struct Piece {
    const std::byte* host;
    int64_t bytes;
    int64_t offset = 0;
  };
  // segment_ids_q, segment_ids_kv, key_padding_mask, row_valid.
  Piece pieces[4] = {
      {p.segment_ids_q, nb * p.T * 4},
      {p.segment_ids_kv, nb * p.S * 4},
      {p.key_padding_mask, nb * p.S},
      {p.row_valid, nb * p.T},
  };
  const int64_t first_element[4] = {b0 * p.T * 4, b0 * p.S * 4, b0 * p.S,
                                    b0 * p.T};
  int64_t total = 0;
  for (Piece& piece : pieces) {
    if (piece.host == nullptr) continue;
    piece.offset = (total + 255) / 256 * 256;
    total = piece.offset + piece.bytes;
  }
  if (total == 0) return absl::OkStatus();
  RETURN_IF_ERROR(staged_inputs_[0].Reserve(total));
  RETURN_IF_ERROR(batch_tensors_.Reserve(total));
  for (int k = 0; k < 4; ++k) {
    if (pieces[k].host == nullptr) continue;
    std::memcpy(staged_inputs_[0].data() + pieces[k].offset,
                pieces[k].host + first_element[k], pieces[k].bytes);
  }
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(batch_tensors_.data(), staged_inputs_[0].data(), total,
                      cudaMemcpyHostToDevice, stream_),
      "copying the per-batch tensors"));
  // The staging buffer is reused at once: wait (a small copy, once a call).
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_),
                             "copying the per-batch tensors"));
  const auto at = [&](int k) -> const std::byte* {
    return pieces[k].host != nullptr ? batch_tensors_.data() + pieces[k].offset
                                     : nullptr;
  };
  params.segment_ids_q = reinterpret_cast<const int32_t*>(at(0));
  params.segment_ids_kv = reinterpret_cast<const int32_t*>(at(1));
  params.key_padding = reinterpret_cast<const uint8_t*>(at(2));
  params.row_valid = reinterpret_cast<const uint8_t*>(at(3));
  return absl::OkStatus();
}

absl::Status RowPipeline::StartChunk(const IndexerKlProblem& p,
                                     const RowData& data, RowRange chunk,
                                     const BlockOutputs& outputs, int slot,
                                     RowKernelParams params) {
  const int64_t n = chunk.size();
  const ChunkInputs in = LayoutChunkInputs(p, data, n);
  const ChunkOutputs out =
      LayoutChunkOutputs(p, outputs.grad != nullptr, outputs.grad_dtype, n);
  const ChunkScratch scratch = LayoutChunkScratch(p, n);
  std::byte* staged = staged_inputs_[slot].data();
  PackRows(data.target, p.T, chunk, p.H, p.row_length, staged, in.target);
  PackRows(data.scores, p.T, chunk, 1, p.row_length, staged, in.scores);
  if (p.sparse())
    PackRows(data.indices, p.T, chunk, 1, p.row_length, staged, in.indices);
  if (data.mask.present()) {
    PackRows(data.mask, p.T, chunk, 1, p.S, staged, in.mask);
  }
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(inputs_.data(), staged, in.bytes,
                                             cudaMemcpyHostToDevice, stream_),
                             "copying rows to the device"));

  params.row_begin = chunk.begin;
  params.n = n;
  PointAtChunk(in, out, scratch, inputs_.data(), outputs_.data(),
               scratch_.data(), data.mask.present(), outputs.grad != nullptr,
               params);
  RETURN_IF_ERROR(
      CudaStatus(LaunchRowKernel(params, stream_), "launching the row kernel"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(staged_outputs_[slot].data(), outputs_.data(),
                                 out.bytes, cudaMemcpyDeviceToHost, stream_),
                 "copying results from the device"));
  return CudaStatus(cudaEventRecord(done_[slot], stream_), "cudaEventRecord");
}

absl::Status RowPipeline::FinishChunk(const IndexerKlProblem& p, RowRange chunk,
                                      const BlockOutputs& outputs, int slot,
                                      std::vector<DeviceRowResult>& results,
                                      bool& row_error) {
  RETURN_IF_ERROR(
      CudaStatus(cudaEventSynchronize(done_[slot]), "computing rows"));
  const int64_t n = chunk.size();
  const ChunkOutputs out =
      LayoutChunkOutputs(p, outputs.grad != nullptr, outputs.grad_dtype, n);
  const std::byte* staged = staged_outputs_[slot].data();
  const size_t first = results.size();
  results.resize(first + n);
  std::memcpy(results.data() + first, staged + out.results,
              n * sizeof(DeviceRowResult));
  row_error = std::any_of(
      results.begin() + first, results.end(), [](const DeviceRowResult& r) {
        return r.error != static_cast<uint8_t>(RowError::kNone);
      });
  if (outputs.grad != nullptr) {
    for (const RowCopy& copy :
         PlanRowCopies(GradLayoutOf(outputs), p.T, chunk, 1, p.row_length)) {
      std::memcpy(outputs.grad + copy.strided, staged + out.grad + copy.packed,
                  copy.bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status RowPipeline::Run(const IndexerKlProblem& p, const RowData& data,
                              RowRange rows, const BlockOutputs& outputs,
                              std::vector<DeviceRowResult>& results) {
  results.clear();
  const int64_t n = rows.size();
  if (n <= 0) return absl::OkStatus();
  SyncOnExit sync(stream_);
  const bool with_grad = outputs.grad != nullptr;

  // Chunks of as many rows as one staging buffer holds.
  const int64_t chunk_rows = RowsPerChunk(
      [&](int64_t c) {
        return LayoutChunkInputs(p, data, c).bytes +
               LayoutChunkOutputs(p, with_grad, outputs.grad_dtype, c).bytes;
      },
      kStagingBudget, n);
  const int64_t in_bytes = LayoutChunkInputs(p, data, chunk_rows).bytes;
  const int64_t out_bytes =
      LayoutChunkOutputs(p, with_grad, outputs.grad_dtype, chunk_rows).bytes;
  for (int slot = 0; slot < 2; ++slot) {
    RETURN_IF_ERROR(staged_inputs_[slot].Reserve(in_bytes));
    RETURN_IF_ERROR(staged_outputs_[slot].Reserve(out_bytes));
  }
  RETURN_IF_ERROR(inputs_.Reserve(in_bytes));
  RETURN_IF_ERROR(outputs_.Reserve(out_bytes));
  RETURN_IF_ERROR(scratch_.Reserve(LayoutChunkScratch(p, chunk_rows).bytes));

  RowKernelParams params = ProblemKernelParams(p, data, outputs);
  RETURN_IF_ERROR(UploadBatchTensors(p, rows, params));

  // Chunk c uses staging slot c % 2. The chunk that last used a slot (c - 2)
  // was finished before chunk c - 1 was started, so the slot is free.
  results.reserve(n);
  RowRange pending;  // started, not yet finished
  int pending_slot = 0;
  bool row_error = false;
  for (int64_t begin = rows.begin, c = 0; begin < rows.end && !row_error;
       begin += chunk_rows, ++c) {
    const RowRange chunk{begin, std::min(begin + chunk_rows, rows.end)};
    const int slot = static_cast<int>(c % 2);
    RETURN_IF_ERROR(StartChunk(p, data, chunk, outputs, slot, params));
    if (pending.size() > 0) {
      RETURN_IF_ERROR(
          FinishChunk(p, pending, outputs, pending_slot, results, row_error));
    }
    pending = chunk;
    pending_slot = slot;
  }
  // After a row error the rows past it need not be computed (the CPU
  // backend stops too): the last started chunk is dropped.
  if (!row_error) {
    RETURN_IF_ERROR(
        FinishChunk(p, pending, outputs, pending_slot, results, row_error));
  }
  return absl::OkStatus();
}

void PointAtChunk(const ChunkInputs& in, const ChunkOutputs& out,
                  const ChunkScratch& scratch, std::byte* d_in,
                  std::byte* d_out, std::byte* d_scratch, bool with_mask,
                  bool with_grad, RowKernelParams& params) {
  params.target = d_in + in.target;
  params.scores = d_in + in.scores;
  params.indices = params.sparse
                       ? reinterpret_cast<const int32_t*>(d_in + in.indices)
                       : nullptr;
  params.mask =
      with_mask ? reinterpret_cast<const uint8_t*>(d_in + in.mask) : nullptr;
  params.valid = scratch.has_valid
                     ? reinterpret_cast<uint8_t*>(d_scratch + scratch.valid)
                     : nullptr;
  params.w =
      scratch.has_w ? reinterpret_cast<float*>(d_scratch + scratch.w) : nullptr;
  params.grad = with_grad ? d_out + out.grad : nullptr;
  params.results = reinterpret_cast<DeviceRowResult*>(d_out + out.results);
}

RowKernelParams ProblemKernelParams(const IndexerKlProblem& p,
                                    const RowData& data,
                                    const BlockOutputs& outputs) {
  RowKernelParams params;
  params.T = p.T;
  params.S = p.S;
  params.K = p.row_length;
  params.H = p.H;
  params.q_offset = p.q_offset;
  params.causal = p.options.causal;
  params.sparse = p.sparse();
  params.per_head = p.per_head();
  params.maxtext = p.options.flavor == Flavor::kMaxText;
  params.diagnostics = p.options.want_diagnostics;
  params.recall_k = p.options.recall_k;
  params.softmax_scale = p.options.softmax_scale;
  params.grad_scale = static_cast<float>(outputs.grad_scale);
  params.target_dtype = data.target.dtype;
  params.scores_dtype = data.scores.dtype;
  params.grad_dtype = outputs.grad_dtype;
  return params;
}

}  // namespace klserve::cuda
