#ifndef KLSERVE_CLIENT_STREAM_CODEC_H_
#define KLSERVE_CLIENT_STREAM_CODEC_H_

// The stream form of a ComputeLoss call: a whole ComputeLossRequest cut into
// a StreamHeader and RowBlocks, and GradBlocks put back together into the
// ComputeLossResponse that the unary call would have returned. No gRPC here,
// so this is testable without a server.

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "klserve/v1/klserve.pb.h"
#include "proto/request_tensors.h"

namespace klserve {

// Whether ComputeLossStream takes `request` at all. The projections form's
// stream has no counting pass, so REDUCTION_MEAN_VALID without row_valid,
// with the client's topk_indices or an attention_mask (whose N needs every
// row before the first gradient), must go as one message: the server
// refuses it on a stream (docs/spec.md). Callers that choose the call by
// size send such a request unary whatever its size.
bool StreamCarries(const v1::ComputeLossRequest& request);

// Cuts the per-row tensors of one request into row blocks, in either form.
// Rows are r = b * T + t over the indexer scores' [B, T, S or K] (the
// projections form: the query's [B, T, H, D]); a block may cross batch
// boundaries. Holds pointers into the request: the request
// must outlive the slicer and stay unchanged. Thread-compatible; const
// methods may run concurrently.
class RequestSlicer {
 public:
  // Checks what slicing relies on: indexer_scores (the projections form:
  // query) present with its rank and dimensions >= 1; the other per-row
  // tensors of the request's form (attention_logits [B, H, T, X],
  // attention_weights / topk_indices / attention_mask [B, T, X]; lse
  // [B, H, T], index_query [B, T, H_I, D_I], index_weights [B, T, H_I]) with
  // the same B and T; and every per-row tensor's byte count matching its
  // dtype and shape. INVALID_ARGUMENT naming the field otherwise. Everything
  // else is left for the server to judge.
  static absl::StatusOr<RequestSlicer> Create(
      const v1::ComputeLossRequest& request);

  // The request without the per-row bytes: ids, tags, options, the per-row
  // tensors' specs and the small and key-side tensors, copied whole.
  v1::StreamHeader MakeHeader() const;

  // Fills `block` with rows [row_begin, row_begin + num_rows), in the layout
  // of RowBlock (per-head logits [H, num_rows, X] and lse [H, num_rows], the
  // others [num_rows, X...]). Requires 0 <= row_begin, num_rows >= 1 and
  // row_begin + num_rows <= num_rows(). Reuses `block`'s string capacity.
  void FillBlock(int64_t row_begin, int64_t num_rows,
                 v1::RowBlock* block) const;

  // Whether the stream sends the rows twice, first with RowBlock.counting
  // set: REDUCTION_MEAN_VALID without row_valid in the logits form, whose N
  // the server knows only once it has seen every row.
  bool counts_first() const { return counts_first_; }

  // Rows per block so that a block, and its answer, hold about
  // `block_bytes` of per-row data: at least 1, at most num_rows(). (An
  // answer may be the larger: a wide top-k selection, FP32 gradients of BF16
  // projections.)
  int64_t BlockRowsFor(int64_t block_bytes) const;

  int64_t num_rows() const { return batch_ * rows_per_batch_; }
  // Bytes of all per-row tensors for one row (every head's logits included).
  int64_t row_bytes() const;
  RequestForm form() const { return form_; }
  // The indexer scores' shape [B, T, X] (the projections form: B, T and D
  // of the query).
  int64_t batch() const { return batch_; }
  int64_t rows_per_batch() const { return rows_per_batch_; }
  int64_t row_width() const { return row_width_; }

 private:
  // One per-row tensor present in the request.
  struct Part {
    const RequestTensor* tensor = nullptr;
    const std::string* data = nullptr;
    int64_t heads = 1;           // H for a per-head tensor, else 1
    int64_t head_row_bytes = 0;  // bytes of one row of one head
  };

  explicit RequestSlicer(const v1::ComputeLossRequest& request)
      : request_(&request) {}

  void FillPart(const Part& part, int64_t row_begin, int64_t num_rows,
                std::string* out) const;

  const v1::ComputeLossRequest* request_;
  RequestForm form_ = RequestForm::kLogits;
  bool counts_first_ = false;
  int64_t batch_ = 0;
  int64_t rows_per_batch_ = 0;
  int64_t row_width_ = 0;
  int64_t answer_row_bytes_ = 0;  // one row's in a GradBlock
  std::vector<Part> parts_;
};

// Rebuilds a ComputeLossResponse from the GradBlocks of a stream.
// Single-threaded use.
class ResponseAssembler {
 public:
  // `scores_shape` is the request's indexer_scores shape [B, T, X]; the
  // gradient gets that shape and row_kl gets [B, T]. `counting_pass`: the
  // stream sent the rows twice (RequestSlicer::counts_first), so the
  // answers to the counting pass come first.
  explicit ResponseAssembler(absl::Span<const int64_t> scores_shape,
                             bool counting_pass = false);

  // Appends one block. Blocks must come in row order without gaps, each with
  // its grad ([num_rows, X] in one dtype) present in all blocks or none, and
  // likewise row_kl (FP64 [num_rows]); first, with `counting_pass`, the
  // counting pass's blocks, in order too, carrying neither, which are
  // dropped. INTERNAL describing the violation otherwise (the server broke
  // the protocol). Moves out of `block`.
  absl::Status Add(v1::GradBlock& block);

  // Rows received so far in the current pass.
  int64_t rows_done() const { return next_row_; }

  // Completes `final_result` (the stream's last message) with the assembled
  // grad and row_kl. INTERNAL when the blocks did not cover every row.
  absl::StatusOr<v1::ComputeLossResponse> Finish(
      v1::ComputeLossResponse final_result);

 private:
  int64_t batch_;
  int64_t rows_per_batch_;
  int64_t row_width_;
  bool counting_;  // in the counting pass
  int64_t next_row_ = 0;
  int blocks_ = 0;
  bool has_grad_ = false;
  bool has_row_kl_ = false;
  std::string grad_dtype_;
  int64_t grad_element_bytes_ = 0;
  std::string grad_data_;
  std::string row_kl_data_;
};

// Rebuilds the ComputeLossResponse of a projections-form request from the
// GradBlocks of its stream: d_index_query [B, T, H_I, D_I], d_index_weights
// [B, T, H_I], the service's topk_indices [B, T, K] and row_kl [B, T], each
// where the blocks carry it; d_index_key comes in the result. Single-threaded
// use.
class ProjectionsResponseAssembler {
 public:
  ProjectionsResponseAssembler(int64_t batch, int64_t rows_per_batch);

  // Appends one block: its rows continue the last (a block may cover no
  // rows, and then carries no tensor), and each tensor is present in every
  // block with rows or in none, [num_rows, ...] in one dtype and row shape.
  // INTERNAL describing the violation otherwise.
  absl::Status Add(v1::GradBlock& block);

  // Completes `final_result` (the stream's last message, with d_index_key)
  // with the assembled tensors. INTERNAL when the blocks did not cover every
  // row, or the result carries a per-row tensor itself.
  absl::StatusOr<v1::ComputeLossResponse> Finish(
      v1::ComputeLossResponse final_result);

 private:
  static constexpr const char* kOutputs[] = {"d_index_query", "d_index_weights",
                                             "topk_indices", "row_kl"};
  // One of kOutputs, as the first block with rows gave it.
  struct Output {
    const char* name = nullptr;
    bool present = false;
    std::string dtype;
    std::vector<int64_t> row_shape;  // the dimensions after the row's
    int64_t row_bytes = 0;
    std::string data;
  };

  int64_t batch_;
  int64_t rows_per_batch_;
  int64_t next_row_ = 0;
  bool seen_rows_ = false;  // a block with rows has come
  Output outputs_[std::size(kOutputs)];
};

}  // namespace klserve

#endif  // KLSERVE_CLIENT_STREAM_CODEC_H_
