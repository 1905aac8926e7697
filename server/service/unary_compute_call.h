#ifndef KLSERVE_SERVER_SERVICE_UNARY_COMPUTE_CALL_H_
#define KLSERVE_SERVER_SERVICE_UNARY_COMPUTE_CALL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/call_watchdog.h"
#include "server/service/service_context.h"

namespace klserve::server {

// The reactor of one unary ComputeLoss call. Its answer waits in memory
// until its client takes it, counted in UnsentAnswers until the call is
// done; an answer left untaken for --stream_idle_timeout (a client that
// stopped reading, its flow-control window shut) ends the call, which frees
// its bytes.
class UnaryComputeCall final : public grpc::ServerUnaryReactor,
                               public CallWatchdog::Watched {
 public:
  // Watched from here on; deletes itself once done.
  UnaryComputeCall(const ServiceContext& context,
                   grpc::CallbackServerContext* call);

  // Sends the answer: the response given to the handler, of
  // `response_bytes`, when OK, or the status alone.
  void Answer(const grpc::Status& status, int64_t response_bytes = 0);

  void OnDone() override;
  void Check(absl::Time now) override;

 private:
  const ServiceContext context_;
  grpc::CallbackServerContext* const call_;
  int64_t unsent_bytes_ = 0;  // set before Finish, read in OnDone
  absl::Mutex mu_;
  std::optional<absl::Time> answered_at_ ABSL_GUARDED_BY(mu_);
  bool expired_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_UNARY_COMPUTE_CALL_H_
