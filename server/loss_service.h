#ifndef KLSERVE_SERVER_LOSS_SERVICE_H_
#define KLSERVE_SERVER_LOSS_SERVICE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "server/service_context.h"

namespace klserve::server {

// The IndexerKl service on gRPC's callback API. Handlers only admit the
// request and hand it on: computation runs on the ComputeExecutor, and the
// streaming RPCs are driven by their own reactors.
class LossService final : public v1::IndexerKl::CallbackService {
 public:
  explicit LossService(const ServiceContext& context) : context_(context) {}

  grpc::ServerUnaryReactor* ComputeLoss(
      grpc::CallbackServerContext* context,
      const v1::ComputeLossRequest* request,
      v1::ComputeLossResponse* response) override;

  grpc::ServerBidiReactor<v1::ComputeLossStreamRequest,
                          v1::ComputeLossStreamResponse>*
  ComputeLossStream(grpc::CallbackServerContext* context) override;

  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const v1::GetServerInfoRequest* request,
      v1::GetServerInfoResponse* response) override;

  grpc::ServerUnaryReactor* FinishStep(
      grpc::CallbackServerContext* context,
      const v1::FinishStepRequest* request,
      v1::FinishStepResponse* response) override;

  grpc::ServerBidiReactor<v1::EchoRequest, v1::EchoResponse>* Echo(
      grpc::CallbackServerContext* context) override;

 private:
  // OK, or UNAUTHENTICATED when a token is required and the call lacks it.
  absl::Status Authenticate(grpc::CallbackServerContext* context,
                            absl::string_view method) const;

  ServiceContext context_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_LOSS_SERVICE_H_
