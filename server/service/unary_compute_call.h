#ifndef KLSERVE_SERVER_SERVICE_UNARY_COMPUTE_CALL_H_
#define KLSERVE_SERVER_SERVICE_UNARY_COMPUTE_CALL_H_

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/service_context.h"
#include "server/service/stream_watchdog.h"

namespace klserve::server {

// The reactor of one unary ComputeLoss call. An answer waits in memory
// until its client takes it: the call counts among the UnsentAnswers until
// it is done, and an answer its client leaves untaken for
// --stream_idle_timeout (its flow-control window shut) ends the call, which
// frees the answer's bytes.
class UnaryComputeCall final : public grpc::ServerUnaryReactor,
                               public StreamWatchdog::Watched {
 public:
  // Watched from here on; deletes itself once done.
  UnaryComputeCall(const ServiceContext& context,
                   grpc::CallbackServerContext* call);

  // Sends the answer: the response given to the handler when OK, or the
  // status alone.
  void Answer(const grpc::Status& status);

  void OnDone() override;
  void Check(absl::Time now) override;

 private:
  const ServiceContext context_;
  grpc::CallbackServerContext* const call_;
  absl::Mutex mu_;
  std::optional<absl::Time> answered_at_ ABSL_GUARDED_BY(mu_);
  bool expired_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_UNARY_COMPUTE_CALL_H_
