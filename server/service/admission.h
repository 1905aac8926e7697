#ifndef KLSERVE_SERVER_SERVICE_ADMISSION_H_
#define KLSERVE_SERVER_SERVICE_ADMISSION_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metrics.h"

namespace klserve::server {

// A refusal at a limit of calls in flight or of what they hold, as the
// clients retry it: RESOURCE_EXHAUSTED with `message`, kOverloadedMetadataKey
// in `call`'s trailing metadata (its value `flag`, the limit's flag without
// dashes), counted in klserve_refused_at_limit_total.
absl::Status RefuseAtLimit(grpc::CallbackServerContext& call,
                           absl::string_view flag, Metrics& metrics,
                           absl::string_view message);

// Counts calls of one kind in flight (unary requests, or open streams).
// Refuses a new one past the limit (RESOURCE_EXHAUSTED) or once draining has
// begun (UNAVAILABLE, which clients retry, on another replica if they have
// one).
class Admission {
 public:
  // `what` names the calls in the refusal ("requests in flight"), `flag` the
  // limit's flag. `metrics` (not owned) gets the in-flight count.
  Admission(int max_in_flight, absl::string_view what, absl::string_view flag,
            Metrics* metrics)
      : max_in_flight_(max_in_flight),
        what_(what),
        flag_(flag),
        metrics_(metrics) {
    metrics_->RegisterLimit(flag_);
  }

  // OK takes a slot, to be given back with Leave. A refusal at the limit
  // adds kOverloadedMetadataKey to `call`'s trailing metadata, so that
  // clients retry it after a backoff.
  absl::Status Enter(grpc::CallbackServerContext& call);
  void Leave();

  void StartDraining();

 private:
  const int max_in_flight_;
  const std::string what_;
  const std::string flag_;
  Metrics* const metrics_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_ADMISSION_H_
