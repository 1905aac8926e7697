#include "server/service/loss_stream_reactor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/loss_computation.h"
#include "kernels/projections_computation.h"
#include "kernels/row_block.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"
#include "server/codec/grpc_status.h"
#include "server/codec/tensor_codec.h"
#include "server/codec/wire_messages.h"
#include "server/service/limits.h"
#include "server/service/loss_tags_from.h"

namespace klserve::server {
namespace {

// `tensor`'s field of a GradBlock, which has its name.
v1::Tensor* GradBlockTensor(const ProjectionsRowOutputTensor& tensor,
                            v1::GradBlock& block) {
  return static_cast<v1::Tensor*>(block.GetReflection()->MutableMessage(
      &block, v1::GradBlock::descriptor()->FindFieldByName(tensor.field)));
}

// The first output `p` asks for (d_index_query with the gradient), which a
// tile's answer over the message limit is named for; null when none.
const char* FirstWantedOutput(const ProjectionsProblem& p) {
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(p)) {
    if (tensor.wanted) return tensor.field;
  }
  return nullptr;
}

// Sets `out` to the outputs of `rows` rows of `p` (each tensor the problem
// asks for, allocated, shaped [rows, ...]) and returns where they go.
ProjectionsBlockOutputs AllocateRows(const ProjectionsProblem& p, int64_t rows,
                                     v1::GradBlock* out) {
  ProjectionsBlockOutputs outputs{.capacity_rows = rows};
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(p)) {
    if (!tensor.wanted) continue;
    // std::string's buffer is aligned for int32 and double.
    tensor.SetIn(outputs,
                 AllocateTensor(tensor.dtype_name, tensor.element_bytes,
                                tensor.row.ShapeOf({rows}),
                                GradBlockTensor(tensor, *out)));
  }
  return outputs;
}

// The answer to a logits-form block of rows `rows` in `response`: its
// GradBlock, with the gradient and row KL the computation writes (none for
// a block of the counting pass).
LossOutputs AllocateBlockAnswer(const IndexerKlProblem& p, RowRange rows,
                                bool counting,
                                v1::ComputeLossStreamResponse& response) {
  const IndexerKlOptions& options = p.options;
  v1::GradBlock* out = response.mutable_grad_block();
  out->set_row_begin(rows.begin);
  out->set_num_rows(rows.size());
  LossOutputs outputs;
  if (!counting && options.want_grad) {
    outputs.grad = AllocateTensor(
        options.grad_dtype, {rows.size(), p.row_length}, out->mutable_grad());
    outputs.grad_byte_size = static_cast<int64_t>(out->grad().data().size());
  }
  if (!counting && options.want_row_kl) {
    outputs.row_kl =
        AllocateFloat64Tensor({rows.size()}, out->mutable_row_kl());
    outputs.row_kl_size = rows.size();
  }
  return outputs;
}

}  // namespace

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
  if (FormOf(header_) == RequestForm::kProjections) {
    return TakeProjectionsHeader();
  }
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
  RETURN_IF_ERROR(CheckOneRowFits(problem, *context_.options));
  RETURN_IF_ERROR(CheckThreadScratch(problem, context_.backends->For(problem),
                                     *context_.options));
  if (problem.options.want_grad || problem.options.want_row_kl) {
    // The answer to a one-row block, with the widest row_begin, measured as
    // ComputeLogitsBlock measures it (its raw bytes passed the limits above,
    // so it is at most a message).
    Response answer;
    const int64_t last = problem.num_rows() - 1;
    AllocateBlockAnswer(problem, {last, last + 1}, /*counting=*/false, answer);
    RETURN_IF_ERROR(CheckMessageBytes(
        problem.options.want_grad ? "grad" : "row_kl",
        static_cast<int64_t>(answer.ByteSizeLong()),
        "a block's answer carries whole rows, so no block of this problem "
        "could be answered",
        *context_.options));
  }
  problem_.emplace(std::move(problem));
  computation_.emplace(context_.backends->For(*problem_), *problem_);
  return absl::OkStatus();
}

absl::Status LossStreamReactor::TakeProjectionsHeader() {
  const ServerOptions& limits = *context_.options;
  ASSIGN_OR_RETURN(const ProjectionsOptions options,
                   ProjectionsOptionsFrom(header_.options()));
  ASSIGN_OR_RETURN(const ProjectionsInputs inputs,
                   ProjectionsInputsFrom(header_));
  // The key side and the small tensors, whole (the query side's specs count
  // no bytes here; its blocks are checked as they come).
  RETURN_IF_ERROR(CheckInputBytes(inputs, limits));
  ASSIGN_OR_RETURN(ProjectionsProblem problem,
                   ProjectionsProblem::Create(inputs, options));
  const ProjectionsProblem& p = problem;
  const IndexerKlOptions& o = p.logits.options;
  // What the stream holds until its end.
  RETURN_IF_ERROR(CheckKeySideBytes(p, /*stream=*/true, limits));
  {
    // The last message carries d_index_key whole and echoes request_id.
    const char* key_remedy =
        DTypeSize(o.grad_dtype) > 2
            ? "ask for a 16-bit grad_dtype, send fewer keys (batch entries) "
              "per stream, or send the problem unary with d_index_key in a "
              "shared-memory region"
            : "send fewer keys (batch entries) per stream, or send the "
              "problem unary with d_index_key in a shared-memory region";
    Response last;
    v1::ComputeLossResponse* result = last.mutable_result();
    result->set_request_id(header_.request_id());
    WidestResultTo(result->mutable_result());
    if (o.want_grad) {
      // Within 64 bits: as many elements as index_key, which is in memory.
      const int64_t bytes =
          *ShapeBytes(DTypeSize(o.grad_dtype), p.key_gradient_shape());
      RETURN_IF_ERROR(CheckTensorBytes("d_index_key", bytes, limits));
      // Its bytes alone, before they are allocated to weigh the message
      // exactly: a header past the limit costs no allocation.
      RETURN_IF_ERROR(
          CheckMessageBytes("d_index_key", bytes, key_remedy, limits));
      AllocateTensor(o.grad_dtype, p.key_gradient_shape(),
                     result->mutable_d_index_key());
    }
    RETURN_IF_ERROR(CheckMessageBytes(
        o.want_grad ? "d_index_key" : "request_id",
        static_cast<int64_t>(last.ByteSizeLong()),
        o.want_grad ? key_remedy : "send a shorter request_id", limits));
  }
  if (const char* first = FirstWantedOutput(p); first != nullptr) {
    // A GradBlock carries at least the whole tile its block completes,
    // whatever the block's size: one tile's answer must fit a message.
    const int64_t rows = p.max_tile_rows();
    const std::string remedy =
        absl::StrCat("a block's answer carries whole tiles of ", rows,
                     " query rows, so one tile's must fit");
    RETURN_IF_ERROR(CheckRowOutputBytes(p, rows, remedy, limits));
    Response tile;
    AllocateRows(p, rows, tile.mutable_grad_block());
    tile.mutable_grad_block()->set_row_begin(p.num_rows());
    tile.mutable_grad_block()->set_num_rows(rows);
    RETURN_IF_ERROR(CheckMessageBytes(
        first, static_cast<int64_t>(tile.ByteSizeLong()), remedy, limits));
  }
  RETURN_IF_ERROR(CheckThreadScratch(p, limits));
  {
    // A block that ends inside a tile leaves that tile's rows held until
    // the next block completes it: at most a tile of every query-side
    // tensor, which must fit one message, as a block of that tile would.
    const ProjectionsComputation::HeldBytes held =
        ProjectionsComputation::MaxHeldBytes(p);
    if (held.total > limits.max_message_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          held.largest.field, ": a tile of ", p.max_tile_rows(),
          " query rows is ", held.total, " bytes (", held.largest.field, " ",
          held.largest.bytes, " of them), over the message limit of ",
          limits.max_message_bytes,
          " (--max_message_bytes); the stream holds the rows of a tile that a "
          "block ends inside, so a tile's must fit one message"));
    }
  }
  projections_problem_.emplace(std::move(problem));
  return absl::OkStatus();
}

absl::Status LossStreamReactor::TakeBlock() {
  if (incoming_.has_header()) {
    return absl::InvalidArgumentError(
        "header: a stream carries one StreamHeader, its first message; after "
        "it only RowBlocks may come");
  }
  if (!incoming_.has_block()) {
    return absl::InvalidArgumentError(
        "block: after the StreamHeader only RowBlocks may come");
  }
  const v1::RowBlock& block = incoming_.block();
  AdmittedBlock admitted;
  if (projections_problem_) {
    if (block.counting()) {
      return absl::InvalidArgumentError(
          "counting: the projections form has no counting pass (its N needs "
          "no rows), got true");
    }
    RETURN_IF_ERROR(CheckNextBlock(next_block_row_, block.row_begin(),
                                   block.num_rows(),
                                   projections_problem_->num_rows()));
    admitted.rows = {block.row_begin(), block.row_begin() + block.num_rows()};
    next_block_row_ = admitted.rows.end;
  } else {
    ASSIGN_OR_RETURN(admitted,
                     computation_->Admit(block.row_begin(), block.num_rows(),
                                         block.counting()));
  }
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
  if (problem_ && !admitted.counting) {
    // A counting block is answered without tensors; the projections form's
    // outputs depend on the rows held back, and are checked as computed.
    RETURN_IF_ERROR(CheckOutputBytes(*problem_, block.num_rows(),
                                     v1::OutputRegions::default_instance(),
                                     "send smaller blocks", options));
  }
  if (!admitted.counting) rows_ += block.num_rows();
  blocks_.push_back(
      Block{std::make_unique<Request>(std::move(incoming_)), admitted});
  incoming_.Clear();
  return absl::OkStatus();
}

void LossStreamReactor::ComputeBlock(Block block) {
  const bool skip = Ending();
  std::unique_ptr<grpc::ByteBuffer> encoded;
  absl::Status status;
  if (!skip) {
    status = [&]() -> absl::Status {
      Response response;
      RETURN_IF_ERROR(projections_problem_
                          ? ComputeProjectionsBlock(block, response)
                          : ComputeLogitsBlock(block, response));
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

absl::Status LossStreamReactor::ComputeLogitsBlock(const Block& block,
                                                   Response& response) {
  const RowRange rows = block.admitted.rows;
  ASSIGN_OR_RETURN(
      const RowData data,
      BlockRowData(*problem_, rows, BlockBytesOf(block.request->block())));
  const LossOutputs outputs =
      AllocateBlockAnswer(*problem_, rows, block.admitted.counting, response);
  RETURN_IF_ERROR(CheckMessageBytes(
      "num_rows", static_cast<int64_t>(response.ByteSizeLong()),
      "send smaller blocks", *context_.options));
  return computation_->Compute(block.admitted, data, outputs);
}

absl::Status LossStreamReactor::ComputeProjectionsBlock(const Block& block,
                                                        Response& response) {
  const ProjectionsProblem& p = *projections_problem_;
  const ServerOptions& limits = *context_.options;
  // A block computes on the threads unary calls compute on, for up to
  // --max_compute_duration as a unary call may: its work grows with its
  // rows times S (the first block's counting pass with all T), from bytes
  // that grow with their sum.
  block_deadline_ns_.store(
      absl::ToUnixNanos(absl::Now() + limits.max_compute_duration),
      std::memory_order_relaxed);
  if (!projections_) {
    // The unary call's backend, so that both give the same bits.
    // A block's tiles stop once the call is ending: a block of many rows
    // against a long key side may compute for longer than the stream may
    // live, and its client may be gone. The call already ends with its own
    // status; this one only stops the work. They stop too once the block
    // has computed for --max_compute_duration, which ends the call.
    ASSIGN_OR_RETURN(
        ProjectionsComputation computation,
        ProjectionsComputation::Create(
            context_.backends->ForProjections(), p,
            [this, limit = limits.max_compute_duration]() -> absl::Status {
              if (Ending()) {
                return absl::CancelledError(
                    "ComputeLossStream: the call is ending");
              }
              if (absl::ToUnixNanos(absl::Now()) >
                  block_deadline_ns_.load(std::memory_order_relaxed)) {
                return absl::DeadlineExceededError(absl::StrCat(
                    "ComputeLossStream: a block computing for more than ",
                    absl::FormatDuration(limit),
                    " (--max_compute_duration); send smaller blocks, or the "
                    "problem to a server with a longer limit"));
              }
              return absl::OkStatus();
            }));
    projections_.emplace(std::move(computation));
    if (projections_->needs_counting()) {
      if (!projections_->counts_without_rows()) {
        return absl::InvalidArgumentError(
            "reduction: REDUCTION_MEAN_VALID without row_valid counts the "
            "rows with a valid key, which with topk_indices or an "
            "attention_mask needs every row before the first gradient, so "
            "the stream cannot carry it; send row_valid, or the problem with "
            "ComputeLoss");
      }
      RETURN_IF_ERROR(projections_->Count({}));
    }
  }
  const RowRange rows = block.admitted.rows;
  ASSIGN_OR_RETURN(
      const ProjectionsRowData data,
      BlockProjectionsRows(p, rows,
                           ProjectionsBlockBytesOf(p, block.request->block())));
  // The block may complete the rows held back from earlier blocks too.
  const int64_t capacity = projections_->held_rows() + rows.size();
  const std::string remedy = absl::StrCat(
      "send smaller blocks (a block's answer also carries the ",
      projections_->held_rows(), " rows held back from earlier blocks)");
  RETURN_IF_ERROR(CheckRowOutputBytes(p, capacity, remedy, limits));
  v1::GradBlock* out = response.mutable_grad_block();
  const ProjectionsBlockOutputs outputs = AllocateRows(p, capacity, out);
  RETURN_IF_ERROR(CheckMessageBytes(
      "num_rows", static_cast<int64_t>(response.ByteSizeLong()), remedy,
      limits));
  ASSIGN_OR_RETURN(const RowRange done,
                   projections_->Compute(rows, data, outputs));
  if (done.size() == 0) {  // every row held back: an answer without tensors
    out->Clear();
  } else {
    for (const ProjectionsRowOutputTensor& tensor :
         ProjectionsRowOutputTensors(p)) {
      if (!tensor.wanted) continue;
      // Keeps the first done.size() rows of the [capacity, ...] tensor.
      v1::Tensor* kept = GradBlockTensor(tensor, *out);
      kept->set_shape(0, done.size());
      kept->mutable_data()->resize(done.size() * tensor.row_bytes());
    }
  }
  out->set_row_begin(done.begin);
  out->set_num_rows(done.size());
  return absl::OkStatus();
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

absl::StatusOr<IndexerKlResult> LossStreamReactor::FinishProjections(
    Response& last) {
  const ProjectionsProblem& p = *projections_problem_;
  if (!projections_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_begin, num_rows: the blocks covered rows [0, 0) of the B*T = ",
        p.num_rows(), " rows"));
  }
  const IndexerKlOptions& o = p.logits.options;
  std::byte* d_index_key = nullptr;
  if (o.want_grad) {
    d_index_key = AllocateTensor(o.grad_dtype, p.key_gradient_shape(),
                                 last.mutable_result()->mutable_d_index_key());
  }
  return projections_->Finish(d_index_key);
}

void LossStreamReactor::SendResult() {
  if (!problem_ && !projections_problem_) {
    Fail(absl::InvalidArgumentError(
        "header: the stream ended before its StreamHeader"));
    return;
  }
  Response last;
  absl::StatusOr<IndexerKlResult> loss =
      projections_problem_ ? FinishProjections(last) : computation_->Finish();
  if (!loss.ok()) {
    Fail(loss.status());
    return;
  }
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
            projections_problem_
                ? projections_problem_->logits.options.scaling_factor
                : problem_->options.scaling_factor)
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
