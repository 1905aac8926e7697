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

// The whole unary computation, on an executor thread.
absl::Status ComputeUnary(const ServiceContext& ctx,
                          const v1::ComputeLossRequest& request,
                          v1::ComputeLossResponse& response) {
  ASSIGN_OR_RETURN(const IndexerKlOptions options,
                   OptionsFrom(request.options()));
  ASSIGN_OR_RETURN(const IndexerKlInputs inputs, InputsFrom(request));
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
  response.set_request_id(request.request_id());
  ResultTo(result, response.mutable_result());
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* LossService::ComputeLoss(
    grpc::CallbackServerContext* context, const v1::ComputeLossRequest* request,
    v1::ComputeLossResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status admitted = context_.admission->Enter(); !admitted.ok()) {
    reactor->Finish(ToGrpcStatus(admitted));
    return reactor;
  }
  // The request and response belong to gRPC until Finish, so the task may
  // use them in place.
  context_.executor->Submit(
      [ctx = context_, context, request, response, reactor] {
        absl::Status status;
        if (context->IsCancelled()) {
          status = absl::CancelledError("cancelled before computing");
        } else {
          status = ComputeUnary(ctx, *request, *response);
        }
        ctx.admission->Leave();
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerBidiReactor<v1::ComputeLossStreamRequest,
                        v1::ComputeLossStreamResponse>*
LossService::ComputeLossStream(grpc::CallbackServerContext* context) {
  return LossStreamReactor::Start(context_, context);
}

grpc::ServerUnaryReactor* LossService::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest*,
    v1::GetServerInfoResponse* response) {
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
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerBidiReactor<v1::EchoRequest, v1::EchoResponse>* LossService::Echo(
    grpc::CallbackServerContext* context) {
  return EchoReactor::Start(context_, context);
}

}  // namespace klserve::server
