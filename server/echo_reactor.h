#ifndef KLSERVE_SERVER_ECHO_REACTOR_H_
#define KLSERVE_SERVER_ECHO_REACTOR_H_

#include "grpcpp/grpcpp.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "server/service_context.h"
#include "server/stream_reactor_base.h"

namespace klserve::server {

// One Echo call: answers each message with one of the size it asks for, with
// the same read-ahead, write queue and memory bound as ComputeLossStream but
// no computation, so that klctl bench can set the loss stream's throughput
// against the transport's alone. Deletes itself when gRPC is done with it.
class EchoReactor final
    : public StreamReactorBase<v1::EchoRequest, v1::EchoResponse> {
 public:
  static EchoReactor* Start(const ServiceContext& context,
                            grpc::CallbackServerContext* call);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  static constexpr int kMaxInFlight = 3;

  explicit EchoReactor(const ServiceContext& context)
      : StreamReactorBase(context, "Echo") {}

  void OnWritten() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { Advance(); }
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_ECHO_REACTOR_H_
