#ifndef KLSERVE_SERVER_ECHO_REACTOR_H_
#define KLSERVE_SERVER_ECHO_REACTOR_H_

#include <deque>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "klserve/v1/klserve.grpc.pb.h"
#include "server/service_context.h"

namespace klserve::server {

// One Echo call: answers each message with one of the size it asks for, with
// the same read-ahead, write queue and memory bound as ComputeLossStream but
// no computation, so that klctl bench can set the loss stream's throughput
// against the transport's alone. Deletes itself when gRPC is done with it.
class EchoReactor final
    : public grpc::ServerBidiReactor<v1::EchoRequest, v1::EchoResponse> {
 public:
  static EchoReactor* Start(const ServiceContext& context,
                            grpc::CallbackServerContext* call);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  static constexpr int kMaxInFlight = 3;

  explicit EchoReactor(const ServiceContext& context) : context_(context) {}
  ~EchoReactor() override;

  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServiceContext context_;
  bool admitted_ = false;
  absl::Mutex mu_;
  v1::EchoRequest incoming_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::unique_ptr<v1::EchoResponse>> writes_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<v1::EchoResponse> writing_ ABSL_GUARDED_BY(mu_);
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_ECHO_REACTOR_H_
