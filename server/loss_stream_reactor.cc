#include "server/loss_stream_reactor.h"

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/loss.h"
#include "kernels/row_block.h"
#include "kernels/status_macros.h"
#include "server/grpc_status.h"
#include "server/limits.h"
#include "server/tensor_codec.h"
#include "server/wire_messages.h"

namespace klserve::server {

LossStreamReactor* LossStreamReactor::Start(const ServiceContext& context,
                                            grpc::CallbackServerContext* call) {
  auto* reactor = new LossStreamReactor(context, call);
  reactor->Begin();
  return reactor;
}

absl::Status LossStreamReactor::TakeHeader() {
  if (!incoming_.has_header()) {
    return absl::InvalidArgumentError(
        "header: the first message of ComputeLossStream must be a "
        "StreamHeader");
  }
  header_ = std::move(*incoming_.mutable_header());
  incoming_.Clear();
  RETURN_IF_ERROR(context_.reporter->CheckTags(header_.tags()));
  ASSIGN_OR_RETURN(const IndexerKlOptions options,
                   OptionsFrom(header_.options()));
  ASSIGN_OR_RETURN(const IndexerKlInputs inputs, InputsFrom(header_));
  // The header carries the small tensors whole.
  RETURN_IF_ERROR(CheckInputBytes(inputs, *context_.options));
  {
    // The last message echoes request_id: it must fit too.
    Response last;
    last.mutable_result()->set_request_id(header_.request_id());
    WidestResultTo(last.mutable_result()->mutable_result());
    RETURN_IF_ERROR(CheckMessageBytes(
        "request_id", static_cast<int64_t>(last.ByteSizeLong()),
        "send a shorter request_id", *context_.options));
  }
  ASSIGN_OR_RETURN(
      IndexerKlProblem problem,
      IndexerKlProblem::Create(inputs, options,
                               IndexerKlProblem::RowTensors::kInBlocks));
  if (!problem.denominator) {
    return absl::InvalidArgumentError(
        "row_valid: REDUCTION_MEAN_VALID over a stream needs row_valid in the "
        "StreamHeader (N must be known before the first gradient block)");
  }
  grad_scale_ = GradScale(problem, *problem.denominator);
  problem_.emplace(std::move(problem));
  return absl::OkStatus();
}

absl::Status LossStreamReactor::TakeBlock() {
  if (!incoming_.has_block()) {
    return absl::InvalidArgumentError(
        "block: after the StreamHeader only RowBlocks may come");
  }
  const v1::RowBlock& block = incoming_.block();
  if (block.row_begin() != rows_received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_begin: blocks must come in order without gaps, "
                     "expected ",
                     rows_received_, ", got ", block.row_begin()));
  }
  const int64_t remaining = problem_->num_rows() - rows_received_;
  if (block.num_rows() < 1 || block.num_rows() > remaining) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_rows: must be in [1, ", remaining,
                     "] (rows not yet sent), got ", block.num_rows()));
  }
  // A block carries only the tensors the header named, each in the field
  // the header named it in: bytes elsewhere would be ignored (or, for the
  // target, read in place of the named field) and give a wrong answer.
  for (const auto& [field, named, bytes] :
       {std::tuple{"attention_logits", header_.has_attention_logits(),
                   block.attention_logits().size()},
        std::tuple{"attention_weights", header_.has_attention_weights(),
                   block.attention_weights().size()},
        std::tuple{"topk_indices", header_.has_topk_indices(),
                   block.topk_indices().size()},
        std::tuple{"attention_mask", header_.has_attention_mask(),
                   block.attention_mask().size()}}) {
    if (!named && bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": the StreamHeader has no ", field,
          ", so a block may not carry it (got ", bytes, " bytes)"));
    }
  }
  const ServerOptions& options = *context_.options;
  for (const auto& [field, bytes] :
       {std::pair{"attention_logits", block.attention_logits().size()},
        std::pair{"attention_weights", block.attention_weights().size()},
        std::pair{"indexer_scores", block.indexer_scores().size()},
        std::pair{"topk_indices", block.topk_indices().size()},
        std::pair{"attention_mask", block.attention_mask().size()}}) {
    RETURN_IF_ERROR(
        CheckTensorBytes(field, static_cast<int64_t>(bytes), options));
  }
  RETURN_IF_ERROR(CheckOutputBytes(*problem_, block.num_rows(),
                                   /*one_message=*/true, options));
  rows_received_ += block.num_rows();
  rows_ = rows_received_;
  blocks_.push_back(std::make_unique<Request>(std::move(incoming_)));
  incoming_.Clear();
  return absl::OkStatus();
}

void LossStreamReactor::ComputeBlock(std::unique_ptr<Request> request) {
  bool skip;
  {
    absl::MutexLock lock(&mu_);
    skip = finishing_;  // cancelled, past the deadline or failed
  }
  std::unique_ptr<grpc::ByteBuffer> encoded;
  absl::Status status;
  if (!skip) {
    status = [&]() -> absl::Status {
      const v1::RowBlock& block = request->block();
      const RowRange rows{block.row_begin(),
                          block.row_begin() + block.num_rows()};
      ASSIGN_OR_RETURN(const RowData data,
                       BlockRowData(*problem_, rows, BlockBytesOf(block)));
      const IndexerKlProblem& p = *problem_;
      Response response;
      v1::GradBlock* out = response.mutable_grad_block();
      out->set_row_begin(rows.begin);
      out->set_num_rows(rows.size());
      BlockOutputs outputs;
      if (p.options.want_grad) {
        outputs.grad =
            AllocateTensor(p.options.grad_dtype, {rows.size(), p.row_length},
                           out->mutable_grad());
        outputs.grad_dtype = p.options.grad_dtype;
        outputs.grad_origin_row = rows.begin;
        // Block rows are contiguous: (b - b0) T K + (t - t0) K = (r - r0) K.
        outputs.grad_batch_stride = p.T * p.row_length;
        outputs.grad_row_stride = p.row_length;
      }
      outputs.grad_scale = grad_scale_;
      if (p.options.want_row_kl) {
        outputs.row_kl =
            AllocateFloat64Tensor({rows.size()}, out->mutable_row_kl());
      }
      RETURN_IF_ERROR(CheckMessageBytes(
          "num_rows", static_cast<int64_t>(response.ByteSizeLong()),
          "send smaller blocks", *context_.options));
      RETURN_IF_ERROR(
          context_.backend->ComputeRows(p, data, rows, outputs, accumulator_));
      ASSIGN_OR_RETURN(encoded, EncodeMessage(response));
      return absl::OkStatus();
    }();
  }
  request.reset();  // the block's memory goes before the next is taken
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    ComputeDone();
    if (!status.ok()) {
      Fail(status);
    } else if (!skip) {
      Queue(std::move(encoded));
      Advance();
    }
    finished = Finished();
  }
  if (finished) delete this;
}

void LossStreamReactor::Advance() {
  if (finishing_) return;
  if (!computing_ && !blocks_.empty()) {
    computing_ = true;
    // std::function needs a copyable callable: the block travels as a raw
    // pointer and is owned again inside.
    Request* block = blocks_.front().release();
    blocks_.pop_front();
    context_.executor->Submit(
        [this, block] { ComputeBlock(std::unique_ptr<Request>(block)); });
  }
  WriteNext();
  ReadNext(
      static_cast<int>(blocks_.size()) + (computing_ ? 1 : 0) + WritesHeld(),
      kMaxBlocksInFlight);
  if (reads_done_ && !computing_ && blocks_.empty() && WritesHeld() == 0 &&
      !result_sent_) {
    SendResult();
  }
}

void LossStreamReactor::SendResult() {
  if (!problem_) {
    Fail(absl::InvalidArgumentError(
        "header: the stream ended before its StreamHeader"));
    return;
  }
  if (rows_received_ != problem_->num_rows()) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "row_begin, num_rows: the blocks covered rows [0, ", rows_received_,
        ") of the B*T=", problem_->num_rows(), " rows")));
    return;
  }
  Response last;
  v1::ComputeLossResponse* result = last.mutable_result();
  result->set_request_id(header_.request_id());
  const IndexerKlResult loss =
      FinishLoss(*problem_, accumulator_, *problem_->denominator);
  ResultTo(loss, result->mutable_result());
  absl::StatusOr<std::unique_ptr<grpc::ByteBuffer>> encoded =
      EncodeMessage(last);
  if (!encoded.ok()) {
    Fail(encoded.status());
    return;
  }
  // Tags were checked with the header: this cannot fail.
  context_.reporter->Add(header_.tags(), loss, problem_->options.scaling_factor)
      .IgnoreError();
  result_sent_ = true;
  Queue(*std::move(encoded));
  WriteNext();
}

void LossStreamReactor::OnWritten() {
  if (result_sent_ && WritesHeld() == 0) {
    FinishOk();
    return;
  }
  Advance();
}

void LossStreamReactor::OnCallDone() {
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    finished = Finished();
  }
  if (finished) delete this;
}

}  // namespace klserve::server
