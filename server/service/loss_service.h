#ifndef KLSERVE_SERVER_SERVICE_LOSS_SERVICE_H_
#define KLSERVE_SERVER_SERVICE_LOSS_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "server/service/service_context.h"

namespace klserve::server {

// Every IndexerKl method on gRPC's callback API, registered raw: requests
// arrive as bytes and responses leave as bytes (server/codec/wire_messages.h
// says why).
using RawIndexerKlService = v1::IndexerKl::WithRawCallbackMethod_ComputeLoss<
    v1::IndexerKl::WithRawCallbackMethod_ComputeLossStream<
        v1::IndexerKl::WithRawCallbackMethod_GetServerInfo<
            v1::IndexerKl::WithRawCallbackMethod_FinishStep<
                v1::IndexerKl::WithRawCallbackMethod_Echo<
                    v1::IndexerKl::WithRawCallbackMethod_RegisterRegion<
                        v1::IndexerKl::WithRawCallbackMethod_UnregisterRegion<
                            v1::IndexerKl::WithRawCallbackMethod_ListRegions<
                                v1::IndexerKl::Service>>>>>>>>;

// The IndexerKl service. Handlers only admit the request and hand it on:
// computation runs on the ComputeExecutor, and the streaming RPCs are driven
// by their own reactors. The token, when one is required, has been checked
// by gRPC before any handler runs (server/service/auth.h).
class LossService final : public RawIndexerKlService {
 public:
  explicit LossService(const ServiceContext& context) : context_(context) {}

  grpc::ServerUnaryReactor* ComputeLoss(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
  ComputeLossStream(grpc::CallbackServerContext* context) override;

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

  grpc::ServerUnaryReactor* FinishStep(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Echo(
      grpc::CallbackServerContext* context) override;

  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

 private:
  ServiceContext context_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LOSS_SERVICE_H_
