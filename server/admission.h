#ifndef KLSERVE_SERVER_ADMISSION_H_
#define KLSERVE_SERVER_ADMISSION_H_

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics.h"

namespace klserve::server {

// Counts the requests in flight. Refuses a new one past the limit
// (RESOURCE_EXHAUSTED) or once draining has begun (UNAVAILABLE, which
// clients retry, on another replica if they have one).
class Admission {
 public:
  // `metrics` (not owned) gets the in-flight count.
  Admission(int max_in_flight, Metrics* metrics)
      : max_in_flight_(max_in_flight), metrics_(metrics) {}

  // OK takes a slot, to be given back with Leave.
  absl::Status Enter();
  void Leave();

  void StartDraining();

 private:
  const int max_in_flight_;
  Metrics* const metrics_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_ADMISSION_H_
