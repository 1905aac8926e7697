#include "server/service/loss_service.h"

#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "kernels/loss.h"
#include "kernels/projections_computation.h"
#include "kernels/projections_loss.h"
#include "kernels/projections_problem.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"
#include "server/codec/call_regions.h"
#include "server/codec/grpc_status.h"
#include "server/codec/tensor_codec.h"
#include "server/codec/wire_messages.h"
#include "server/service/echo_reactor.h"
#include "server/service/limits.h"
#include "server/service/loss_stream_reactor.h"
#include "server/service/loss_tags_from.h"
#include "server/service/region_answer_checks.h"
#include "server/service/region_rpcs.h"
#include "server/service/unary_compute_call.h"
#include "server/service/version.h"

namespace klserve::server {
namespace {

constexpr char kUnaryRemedy[] = "send the problem with ComputeLossStream";

// Checks, before computing, that `response` with the widest result fits
// one message, so that a response gRPC would refuse to send is never
// computed or counted; an error names the largest of `outputs` that the
// message carries.
absl::Status CheckResponseFits(absl::Span<const OutputBytes> outputs,
                               v1::ComputeLossResponse& response,
                               const ServerOptions& options) {
  WidestResultTo(response.mutable_result());
  const auto bytes = static_cast<int64_t>(response.ByteSizeLong());
  response.clear_result();
  const OutputBytes* largest = LargestInMessage(outputs);
  if (largest == nullptr) {
    return CheckMessageBytes("request_id", bytes, "send a shorter request_id",
                             options);
  }
  return CheckMessageBytes(
      largest->field, bytes,
      largest->RemedyUnder(options.max_message_bytes, kUnaryRemedy), options);
}

// A logits-form request's computation into `response`.
absl::StatusOr<IndexerKlResult> ComputeLogitsForm(
    const ServiceContext& ctx, const v1::ComputeLossRequest& request,
    const IndexerKlOptions& options, CallRegions& regions,
    v1::ComputeLossResponse& response, int64_t& rows_computed) {
  ASSIGN_OR_RETURN(const IndexerKlInputs inputs, InputsFrom(request, regions));
  RETURN_IF_ERROR(CheckInputBytes(inputs, *ctx.options));
  ASSIGN_OR_RETURN(const IndexerKlProblem problem,
                   IndexerKlProblem::Create(inputs, options));
  RETURN_IF_ERROR(
      CheckThreadScratch(problem, ctx.backends->For(problem), *ctx.options));
  ASSIGN_OR_RETURN(const RowData rows, WholeRowData(problem, inputs));
  // Outputs placed in regions are not in the message: CheckResponseFits
  // below weighs what is.
  const std::vector<OutputBytes> output_bytes =
      OutputBytesOf(problem, problem.num_rows(), request.outputs());
  RETURN_IF_ERROR(CheckOutputsFit(output_bytes, kUnaryRemedy, *ctx.options));
  LossOutputs outputs;
  if (options.want_grad) {
    ASSIGN_OR_RETURN(outputs.grad,
                     PlaceOutput("grad", options.grad_dtype,
                                 {problem.B, problem.T, problem.row_length},
                                 request, regions, response));
    outputs.grad_byte_size =
        problem.num_rows() * problem.row_length * DTypeSize(options.grad_dtype);
  }
  if (options.want_row_kl) {
    ASSIGN_OR_RETURN(outputs.row_kl, PlaceRowKl({problem.B, problem.T}, request,
                                                regions, response));
    outputs.row_kl_size = problem.num_rows();
  }
  RETURN_IF_ERROR(CheckOutputsProduced(request, response));
  RETURN_IF_ERROR(CheckResponseFits(output_bytes, response, *ctx.options));
  ASSIGN_OR_RETURN(
      const IndexerKlResult result,
      ComputeIndexerKl(ctx.backends->For(problem), problem, rows, outputs));
  if (!regions.empty() && outputs.grad != nullptr) {
    // A row KL that is not finite also makes the loss so, which the caller
    // checks.
    RETURN_IF_ERROR(CheckGradientFinite(regions.first_name(),
                                        options.grad_dtype, outputs.grad,
                                        outputs.grad_byte_size));
  }
  rows_computed = problem.num_rows();
  return result;
}

// A projections-form request's computation into `response`: the indexer's
// three gradients in place of grad, and the service's top-k selection.
absl::StatusOr<IndexerKlResult> ComputeProjectionsForm(
    const ServiceContext& ctx, const v1::ComputeLossRequest& request,
    const ProjectionsOptions& options, CallRegions& regions,
    v1::ComputeLossResponse& response, int64_t& rows_computed, StopCheck stop) {
  ASSIGN_OR_RETURN(const ProjectionsInputs inputs,
                   ProjectionsInputsFrom(request, regions));
  RETURN_IF_ERROR(CheckInputBytes(inputs, *ctx.options));
  ASSIGN_OR_RETURN(const ProjectionsProblem problem,
                   ProjectionsProblem::Create(inputs, options));
  RETURN_IF_ERROR(CheckKeySideBytes(problem, /*stream=*/false, *ctx.options));
  // Outputs placed in regions are not in the message: CheckResponseFits
  // below weighs what is.
  const std::vector<OutputBytes> output_bytes =
      OutputBytesOf(problem, request.outputs());
  RETURN_IF_ERROR(CheckOutputsFit(output_bytes, kUnaryRemedy, *ctx.options));
  RETURN_IF_ERROR(CheckThreadScratch(problem, *ctx.options));
  ProjectionsOutputs outputs{.rows = {.capacity_rows = problem.num_rows()}};
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(problem)) {
    if (!tensor.wanted) continue;
    // std::string's buffer, and a region's slice by its rule, are aligned
    // for int32 and double.
    ASSIGN_OR_RETURN(
        std::byte * bytes,
        PlaceOutput(tensor.field, tensor.dtype_name, tensor.element_bytes,
                    tensor.row.ShapeOf({problem.B, problem.T}), request,
                    regions, response));
    tensor.SetIn(outputs.rows, bytes);
  }
  if (problem.logits.options.want_grad) {
    ASSIGN_OR_RETURN(
        outputs.d_index_key,
        PlaceOutput("d_index_key", problem.logits.options.grad_dtype,
                    problem.key_gradient_shape(), request, regions, response));
  }
  RETURN_IF_ERROR(CheckOutputsProduced(request, response));
  RETURN_IF_ERROR(CheckResponseFits(output_bytes, response, *ctx.options));
  ASSIGN_OR_RETURN(const ProjectionsRowData rows,
                   WholeProjectionsRows(problem, inputs));
  ASSIGN_OR_RETURN(
      const IndexerKlResult result,
      ComputeProjectionsLoss(ctx.backends->ForProjections(), problem, rows,
                             outputs, std::move(stop)));
  rows_computed = problem.B * problem.T;
  return result;
}

// What stops a unary projections computation at the next step of a tile:
// the client gone (a cancel, its deadline) or --max_compute_duration since
// the call arrived.
StopCheck UnaryStopCheck(grpc::CallbackServerContext* context, absl::Time start,
                         const ServerOptions& options) {
  const absl::Duration limit = options.max_compute_duration;
  return [context, deadline = start + limit, limit]() -> absl::Status {
    if (context->IsCancelled()) {
      return absl::CancelledError(
          "ComputeLoss: cancelled by the client or its deadline while "
          "computing");
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "ComputeLoss: running for more than ", absl::FormatDuration(limit),
          " (--max_compute_duration); send the problem with "
          "ComputeLossStream, or to a server with a longer limit"));
    }
    return absl::OkStatus();
  };
}

// The whole unary computation, on an executor thread: `bytes` in, `out`
// encoded; `rows_computed` gets the rows computed. `stop` is asked between
// the steps of each tile of a projections computation.
absl::Status ComputeUnary(const ServiceContext& ctx,
                          grpc::CallbackServerContext& call,
                          grpc::ByteBuffer& bytes, grpc::ByteBuffer& out,
                          int64_t& rows_computed, StopCheck stop) {
  v1::ComputeLossRequest request;
  RETURN_IF_ERROR(ParseMessage(bytes, "ComputeLoss request", request));
  // The parsed request is all that is read from here on: its bytes go now
  // instead of when the call ends, so a large request is held once, not
  // twice.
  bytes.Clear();
  RETURN_IF_ERROR(ctx.reporter->CheckTags(LossTagsFrom(request.tags())));
  v1::ComputeLossResponse response;
  response.set_request_id(request.request_id());
  int64_t rows = 0;
  absl::StatusOr<IndexerKlResult> result;
  double scaling_factor = 1;
  // Held until the response is encoded: no region this call reads or
  // writes is unmapped before.
  CallRegions regions(ctx.regions, IsLocalPeer(call.peer()),
                      ctx.options->max_tensor_bytes);
  if (FormOf(request) == RequestForm::kProjections) {
    ASSIGN_OR_RETURN(const ProjectionsOptions options,
                     ProjectionsOptionsFrom(request.options()));
    scaling_factor = options.loss.scaling_factor;
    result = ComputeProjectionsForm(ctx, request, options, regions, response,
                                    rows, std::move(stop));
  } else {
    ASSIGN_OR_RETURN(const IndexerKlOptions options,
                     OptionsFrom(request.options()));
    scaling_factor = options.scaling_factor;
    result = ComputeLogitsForm(ctx, request, options, regions, response, rows);
  }
  if (!regions.empty()) {
    // A region damaged under the call explains whatever else went wrong
    // (zeros read in place of its bytes fail checks of their own).
    RETURN_IF_ERROR(regions.CheckIntact());
  }
  if (!result.ok()) return result.status();
  if (!regions.empty()) {
    RETURN_IF_ERROR(CheckResultFinite(regions.first_name(), *result));
  }
  ResultTo(*result, response.mutable_result());
  RETURN_IF_ERROR(EncodeMessage(response, out));
  rows_computed = rows;
  // A call its client cancelled, or whose deadline passed, while it computed
  // is answered to nobody, so its sample must not count in its step: a job
  // that retries it would count it twice.
  if (call.IsCancelled()) {
    return absl::CancelledError(
        "ComputeLoss: cancelled by the client or its deadline while "
        "computing; not counted in its step");
  }
  // Tags were checked above: this cannot fail.
  ctx.reporter->Add(LossTagsFrom(request.tags()), *result, scaling_factor)
      .IgnoreError();
  return absl::OkStatus();
}

// Records a unary call in the request metrics, as it is answered.
void RecordUnary(const ServiceContext& ctx, absl::string_view method,
                 absl::Time start, const absl::Status& status, int64_t bytes_in,
                 int64_t bytes_out, int64_t rows) {
  ctx.metrics->RecordRequest(method, absl::StatusCodeToString(status.code()),
                             absl::ToDoubleSeconds(absl::Now() - start),
                             bytes_in, bytes_out, rows);
}

// Finishes a unary call and records it in the request metrics.
void FinishUnary(const ServiceContext& ctx, grpc::ServerUnaryReactor* reactor,
                 absl::string_view method, absl::Time start,
                 const absl::Status& status, int64_t bytes_in,
                 int64_t bytes_out, int64_t rows) {
  RecordUnary(ctx, method, start, status, bytes_in, bytes_out, rows);
  reactor->Finish(ToGrpcStatus(status));
}

// A stream refused before it started: finishes at once with `status`.
class RefusedStream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerUnaryReactor* LossService::ComputeLoss(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new UnaryComputeCall(context_, context);
  const absl::Time start = absl::Now();
  const auto bytes_in = static_cast<int64_t>(request->Length());
  const auto refuse = [&](const absl::Status& status) {
    RecordUnary(context_, "ComputeLoss", start, status, bytes_in, 0, 0);
    call->Answer(ToGrpcStatus(status));
    return call;
  };
  // gRPC hands over a call whose client reset it, message or not: it gets
  // no slot and no compute task (a flood of resets would fill both).
  if (context->IsCancelled()) {
    return refuse(absl::CancelledError("cancelled by the client"));
  }
  if (absl::Status unsent = context_.unsent_answers->Admit(*context);
      !unsent.ok()) {
    return refuse(unsent);
  }
  if (absl::Status admitted = context_.requests->Enter(*context);
      !admitted.ok()) {
    return refuse(admitted);
  }
  // The request and response belong to gRPC until Finish, so the task may
  // use them in place; the request's bytes are the call's to drop once
  // parsed, which is why they are taken as mutable.
  auto* request_bytes = const_cast<grpc::ByteBuffer*>(request);
  context_.executor->Submit([ctx = context_, context, request_bytes, response,
                             call, start, bytes_in] {
    absl::Status status;
    int64_t rows = 0;
    if (context->IsCancelled()) {
      status = absl::CancelledError("cancelled before computing");
    } else {
      status = ComputeUnary(ctx, *context, *request_bytes, *response, rows,
                            UnaryStopCheck(context, start, *ctx.options));
    }
    ctx.requests->Leave();
    const int64_t bytes_out =
        status.ok() ? static_cast<int64_t>(response->Length()) : 0;
    RecordUnary(ctx, "ComputeLoss", start, status, bytes_in, bytes_out, rows);
    call->Answer(ToGrpcStatus(status), bytes_out);
  });
  return call;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
LossService::ComputeLossStream(grpc::CallbackServerContext* context) {
  return LossStreamReactor::Start(context_, context);
}

grpc::ServerUnaryReactor* LossService::GetServerInfo(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  const absl::Time start = absl::Now();
  const absl::Status status = [&]() -> absl::Status {
    v1::GetServerInfoRequest parsed;
    RETURN_IF_ERROR(ParseMessage(*request, "GetServerInfo request", parsed));
    const ServerOptions& options = *context_.options;
    v1::GetServerInfoResponse info;
    info.set_version(std::string(kVersion));
    info.set_backend(std::string(context_.backends->primary().name()));
    info.set_device(context_.backends->primary().device());
    info.set_threads(context_.backends->primary().threads());
    info.set_max_message_bytes(options.max_message_bytes);
    info.set_max_tensor_bytes(options.max_tensor_bytes);
    info.set_max_concurrent_requests(options.max_concurrent_requests);
    info.set_max_open_streams(options.max_open_streams);
    info.set_max_stream_key_bytes(options.max_stream_key_bytes);
    info.set_max_thread_scratch_bytes(options.max_thread_scratch_bytes);
    info.set_shared_memory(context_.regions != nullptr);
    for (DType dtype : kFloatDTypes) {
      info.add_input_dtypes(DTypeName(dtype));
      info.add_grad_dtypes(DTypeName(dtype));
    }
    return EncodeMessage(info, *response);
  }();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishUnary(context_, reactor, "GetServerInfo", start, status,
              static_cast<int64_t>(request->Length()),
              static_cast<int64_t>(response->Length()), 0);
  return reactor;
}

grpc::ServerUnaryReactor* LossService::FinishStep(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  const absl::Time start = absl::Now();
  const absl::Status status = [&]() -> absl::Status {
    v1::FinishStepRequest parsed;
    RETURN_IF_ERROR(ParseMessage(*request, "FinishStep request", parsed));
    const absl::StatusOr<FinishedStep> step =
        context_.reporter->FinishStep(parsed.run(), parsed.step());
    v1::FinishStepResponse finished;
    if (step.ok()) {
      finished.set_indexer_loss(step->loss);
      finished.set_indexer_loss_unscaled(step->unscaled_loss);
      finished.set_requests(step->samples);
    } else if (absl::IsAlreadyExists(step.status())) {
      // Another rank's call, or the run's next step, got there first: its
      // values when the server still has them, else NaN (never a 0 that
      // reads as a perfect indexer).
      finished.set_already_finished(true);
      const std::optional<PublishedValues> values =
          context_.reporter->LastPublished(parsed.run(), parsed.step());
      constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
      finished.set_indexer_loss(values ? values->loss : kNaN);
      finished.set_indexer_loss_unscaled(values ? values->unscaled_loss : kNaN);
      finished.set_requests(values ? values->samples : 0);
    } else {
      return step.status();
    }
    return EncodeMessage(finished, *response);
  }();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishUnary(context_, reactor, "FinishStep", start, status,
              static_cast<int64_t>(request->Length()),
              static_cast<int64_t>(response->Length()), 0);
  return reactor;
}

namespace {

// A region RPC, answered on gRPC's thread: each is a table update (or one
// mmap), never a computation.
using RegionRpc = absl::Status (*)(const ServiceContext&, absl::string_view,
                                   const grpc::ByteBuffer&, grpc::ByteBuffer&);
grpc::ServerUnaryReactor* AnswerRegionRpc(const ServiceContext& ctx,
                                          absl::string_view method,
                                          RegionRpc rpc,
                                          grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) {
  const absl::Time start = absl::Now();
  const absl::Status status = rpc(ctx, context->peer(), *request, *response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishUnary(ctx, reactor, method, start, status,
              static_cast<int64_t>(request->Length()),
              static_cast<int64_t>(response->Length()), 0);
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* LossService::RegisterRegion(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return AnswerRegionRpc(context_, "RegisterRegion", &server::RegisterRegion,
                         context, request, response);
}

grpc::ServerUnaryReactor* LossService::UnregisterRegion(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return AnswerRegionRpc(context_, "UnregisterRegion",
                         &server::UnregisterRegion, context, request, response);
}

grpc::ServerUnaryReactor* LossService::ListRegions(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return AnswerRegionRpc(context_, "ListRegions", &server::ListRegions, context,
                         request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* LossService::Echo(
    grpc::CallbackServerContext* context) {
  if (!context_.options->enable_echo) {
    const absl::Status off = absl::UnimplementedError(
        "Echo: off on this server (start klserve with --enable_echo)");
    context_.metrics->RecordRequest(
        "Echo", absl::StatusCodeToString(off.code()), 0, 0, 0, 0);
    return new RefusedStream(ToGrpcStatus(off));
  }
  return EchoReactor::Start(context_, context);
}

}  // namespace klserve::server
