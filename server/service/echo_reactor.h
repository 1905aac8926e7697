#ifndef KLSERVE_SERVER_SERVICE_ECHO_REACTOR_H_
#define KLSERVE_SERVER_SERVICE_ECHO_REACTOR_H_

#include "grpcpp/grpcpp.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "server/service/service_context.h"
#include "server/service/stream_reactor_base.h"

namespace klserve::server {

// One Echo call (served only with --enable_echo): answers each message with
// one of the size it asks for, with the same read-ahead, write queue, memory
// bound and timeouts as ComputeLossStream but no computation, so that klctl
// bench can set the loss stream's throughput against the transport's alone.
// Deletes itself when gRPC is done with it.
class EchoReactor final : public StreamReactorBase<v1::EchoRequest> {
 public:
  static EchoReactor* Start(const ServiceContext& context,
                            grpc::CallbackServerContext* call);

 private:
  static constexpr int kMaxInFlight = 3;

  EchoReactor(const ServiceContext& context, grpc::CallbackServerContext* call)
      : StreamReactorBase(context, call, "Echo") {}

  absl::Status OnMessage() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWritten() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { Advance(); }
  void Advance() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCallDone() override { delete this; }
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_ECHO_REACTOR_H_
