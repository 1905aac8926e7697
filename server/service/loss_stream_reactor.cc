#include "server/service/loss_stream_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/loss_computation.h"
#include "kernels/row_block.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"
#include "server/codec/grpc_status.h"
#include "server/codec/tensor_codec.h"
#include "server/codec/wire_messages.h"
#include "server/service/limits.h"
#include "server/service/loss_tags_from.h"

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
  RETURN_IF_ERROR(context_.reporter->CheckTags(LossTagsFrom(header_.tags())));
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
  ASSIGN_OR_RETURN(IndexerKlProblem problem,
                   IndexerKlProblem::Create(inputs, options));
  problem_.emplace(std::move(problem));
  computation_.emplace(context_.backends->For(*problem_), *problem_);
  return absl::OkStatus();
}

absl::Status LossStreamReactor::TakeBlock() {
  if (!incoming_.has_block()) {
    return absl::InvalidArgumentError(
        "block: after the StreamHeader only RowBlocks may come");
  }
  const v1::RowBlock& block = incoming_.block();
  ASSIGN_OR_RETURN(const AdmittedBlock admitted,
                   computation_->Admit(block.row_begin(), block.num_rows(),
                                       block.counting()));
  // A block carries only the tensors the header named, each in the field
  // the header named it in: bytes elsewhere would be ignored (or, for the
  // target, read in place of the named field) and give a wrong answer.
  for (const RequestTensor& tensor : PerRowTensors()) {
    const size_t bytes = BlockBytes(block, tensor).size();
    if (FindSpec(header_, tensor) == nullptr && bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor.name, ": the StreamHeader has no ", tensor.name,
          ", so a block may not carry it (got ", bytes, " bytes)"));
    }
  }
  const ServerOptions& options = *context_.options;
  for (const RequestTensor& tensor : PerRowTensors()) {
    RETURN_IF_ERROR(CheckTensorBytes(
        tensor.name, static_cast<int64_t>(BlockBytes(block, tensor).size()),
        options));
  }
  if (!admitted.counting) {  // a counting block is answered without tensors
    RETURN_IF_ERROR(CheckOutputBytes(*problem_, block.num_rows(),
                                     /*one_message=*/true, options));
    rows_ += block.num_rows();
  }
  blocks_.push_back(
      Block{std::make_unique<Request>(std::move(incoming_)), admitted});
  incoming_.Clear();
  return absl::OkStatus();
}

void LossStreamReactor::ComputeBlock(Block block) {
  bool skip;
  {
    absl::MutexLock lock(&mu_);
    skip = finishing_;  // cancelled, past the deadline or failed
  }
  std::unique_ptr<grpc::ByteBuffer> encoded;
  absl::Status status;
  if (!skip) {
    status = [&]() -> absl::Status {
      const RowRange rows = block.admitted.rows;
      ASSIGN_OR_RETURN(
          const RowData data,
          BlockRowData(*problem_, rows, BlockBytesOf(block.request->block())));
      const IndexerKlOptions& options = problem_->options;
      Response response;
      v1::GradBlock* out = response.mutable_grad_block();
      out->set_row_begin(rows.begin);
      out->set_num_rows(rows.size());
      LossOutputs outputs;
      if (!block.admitted.counting && options.want_grad) {
        outputs.grad = AllocateTensor(options.grad_dtype,
                                      {rows.size(), problem_->row_length},
                                      out->mutable_grad());
        outputs.grad_byte_size =
            static_cast<int64_t>(out->grad().data().size());
      }
      if (!block.admitted.counting && options.want_row_kl) {
        outputs.row_kl =
            AllocateFloat64Tensor({rows.size()}, out->mutable_row_kl());
        outputs.row_kl_size = rows.size();
      }
      RETURN_IF_ERROR(CheckMessageBytes(
          "num_rows", static_cast<int64_t>(response.ByteSizeLong()),
          "send smaller blocks", *context_.options));
      RETURN_IF_ERROR(computation_->Compute(block.admitted, data, outputs));
      ASSIGN_OR_RETURN(encoded, EncodeMessage(response));
      return absl::OkStatus();
    }();
  }
  block.request.reset();  // the block's memory goes before the next is taken
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
    Request* request = blocks_.front().request.release();
    const AdmittedBlock admitted = blocks_.front().admitted;
    blocks_.pop_front();
    context_.executor->Submit([this, request, admitted] {
      ComputeBlock(Block{std::unique_ptr<Request>(request), admitted});
    });
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
  absl::StatusOr<IndexerKlResult> loss = computation_->Finish();
  if (!loss.ok()) {
    Fail(loss.status());
    return;
  }
  Response last;
  v1::ComputeLossResponse* result = last.mutable_result();
  result->set_request_id(header_.request_id());
  ResultTo(*loss, result->mutable_result());
  absl::StatusOr<std::unique_ptr<grpc::ByteBuffer>> encoded =
      EncodeMessage(last);
  if (!encoded.ok()) {
    Fail(encoded.status());
    return;
  }
  // Tags were checked with the header: this cannot fail.
  context_.reporter
      ->Add(LossTagsFrom(header_.tags()), *loss,
            problem_->options.scaling_factor)
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
