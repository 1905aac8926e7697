#include "server/loss_service.h"

#include "kernels/loss.h"
#include "kernels/status_macros.h"
#include "server/echo_reactor.h"
#include "server/grpc_status.h"
#include "server/limits.h"
#include "server/loss_stream_reactor.h"
#include "server/tensor_codec.h"
#include "server/version.h"

namespace klserve::server {
namespace {

// The whole unary computation, on an executor thread; `rows` gets the rows
// computed.
absl::Status ComputeUnary(const ServiceContext& ctx,
                          const v1::ComputeLossRequest& request,
                          v1::ComputeLossResponse& response, int64_t& rows) {
  RETURN_IF_ERROR(ctx.reporter->CheckTags(request.tags()));
  ASSIGN_OR_RETURN(const IndexerKlOptions options,
                   OptionsFrom(request.options()));
  ASSIGN_OR_RETURN(const IndexerKlInputs inputs, InputsFrom(request));
  RETURN_IF_ERROR(CheckInputBytes(inputs, *ctx.options));
  ASSIGN_OR_RETURN(const IndexerKlProblem problem,
                   IndexerKlProblem::Create(inputs, options));
  RETURN_IF_ERROR(CheckOutputBytes(problem, problem.num_rows(),
                                   /*one_message=*/true, *ctx.options));
  LossOutputs outputs;
  if (options.want_grad) {
    outputs.grad =
        AllocateTensor(options.grad_dtype, {problem.B, problem.T, problem.K},
                       response.mutable_grad());
    outputs.grad_byte_size =
        static_cast<int64_t>(response.grad().data().size());
  }
  if (options.want_row_kl) {
    outputs.row_kl = AllocateFloat64Tensor({problem.B, problem.T},
                                           response.mutable_row_kl());
    outputs.row_kl_size = problem.num_rows();
  }
  ASSIGN_OR_RETURN(const IndexerKlResult result,
                   ComputeIndexerKl(*ctx.backend, problem, outputs));
  rows = problem.num_rows();
  response.set_request_id(request.request_id());
  ResultTo(result, response.mutable_result());
  // Tags were checked above: this cannot fail.
  ctx.reporter->Add(request.tags(), result, options.scaling_factor)
      .IgnoreError();
  return absl::OkStatus();
}

// Finishes a unary call and records it in the request metrics.
void FinishUnary(const ServiceContext& ctx, grpc::ServerUnaryReactor* reactor,
                 absl::string_view method, absl::Time start,
                 const absl::Status& status, int64_t bytes_in,
                 int64_t bytes_out, int64_t rows) {
  ctx.metrics->RecordRequest(method, absl::StatusCodeToString(status.code()),
                             absl::ToDoubleSeconds(absl::Now() - start),
                             bytes_in, bytes_out, rows);
  reactor->Finish(ToGrpcStatus(status));
}

// A stream refused before it started: finishes at once with `status`.
template <typename Request, typename Response>
class RefusedStream final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// The one authentication check of every IndexerKl RPC (health is gRPC's own
// service and never gets here). A refused call is counted in the request
// metrics under its method with code UNAUTHENTICATED.
absl::Status LossService::Authenticate(grpc::CallbackServerContext* context,
                                       absl::string_view method) const {
  if (context_.auth == nullptr) return absl::OkStatus();
  absl::Status status = context_.auth->Check(*context);
  if (!status.ok()) {
    context_.metrics->RecordRequest(
        method, absl::StatusCodeToString(status.code()), 0, 0, 0, 0);
  }
  return status;
}

grpc::ServerUnaryReactor* LossService::ComputeLoss(
    grpc::CallbackServerContext* context, const v1::ComputeLossRequest* request,
    v1::ComputeLossResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status auth = Authenticate(context, "ComputeLoss"); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  const absl::Time start = absl::Now();
  if (absl::Status admitted = context_.admission->Enter(); !admitted.ok()) {
    FinishUnary(context_, reactor, "ComputeLoss", start, admitted, 0, 0, 0);
    return reactor;
  }
  // The request and response belong to gRPC until Finish, so the task may
  // use them in place.
  context_.executor->Submit([ctx = context_, context, request, response,
                             reactor, start] {
    absl::Status status;
    int64_t rows = 0;
    if (context->IsCancelled()) {
      status = absl::CancelledError("cancelled before computing");
    } else {
      status = ComputeUnary(ctx, *request, *response, rows);
    }
    ctx.admission->Leave();
    FinishUnary(
        ctx, reactor, "ComputeLoss", start, status,
        static_cast<int64_t>(request->ByteSizeLong()),
        status.ok() ? static_cast<int64_t>(response->ByteSizeLong()) : 0, rows);
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::ComputeLossStreamRequest,
                        v1::ComputeLossStreamResponse>*
LossService::ComputeLossStream(grpc::CallbackServerContext* context) {
  if (absl::Status auth = Authenticate(context, "ComputeLossStream");
      !auth.ok()) {
    return new RefusedStream<v1::ComputeLossStreamRequest,
                             v1::ComputeLossStreamResponse>(ToGrpcStatus(auth));
  }
  return LossStreamReactor::Start(context_, context);
}

grpc::ServerUnaryReactor* LossService::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest*,
    v1::GetServerInfoResponse* response) {
  if (absl::Status auth = Authenticate(context, "GetServerInfo"); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  const ServerOptions& options = *context_.options;
  response->set_version(std::string(kVersion));
  response->set_backend(std::string(context_.backend->name()));
  response->set_device(context_.backend->device());
  response->set_threads(context_.backend->threads());
  response->set_max_message_bytes(options.max_message_bytes);
  response->set_max_tensor_bytes(options.max_tensor_bytes);
  response->set_max_concurrent_requests(options.max_concurrent_requests);
  for (const char* dtype : {"FP32", "BF16", "FP16"}) {
    response->add_input_dtypes(dtype);
    response->add_grad_dtypes(dtype);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishUnary(context_, reactor, "GetServerInfo", absl::Now(), absl::OkStatus(),
              0, 0, 0);
  return reactor;
}

grpc::ServerUnaryReactor* LossService::FinishStep(
    grpc::CallbackServerContext* context, const v1::FinishStepRequest* request,
    v1::FinishStepResponse* response) {
  if (absl::Status auth = Authenticate(context, "FinishStep"); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<server::FinishedStep> step =
      context_.reporter->FinishStep(request->run(), request->step());
  if (step.ok()) {
    response->set_indexer_loss(step->loss);
    response->set_indexer_loss_unscaled(step->unscaled_loss);
    response->set_requests(step->samples);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishUnary(context_, reactor, "FinishStep", start, step.status(), 0, 0, 0);
  return reactor;
}

grpc::ServerBidiReactor<v1::EchoRequest, v1::EchoResponse>* LossService::Echo(
    grpc::CallbackServerContext* context) {
  if (absl::Status auth = Authenticate(context, "Echo"); !auth.ok()) {
    return new RefusedStream<v1::EchoRequest, v1::EchoResponse>(
        ToGrpcStatus(auth));
  }
  return EchoReactor::Start(context_, context);
}

}  // namespace klserve::server
