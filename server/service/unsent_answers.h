#ifndef KLSERVE_SERVER_SERVICE_UNSENT_ANSWERS_H_
#define KLSERVE_SERVER_SERVICE_UNSENT_ANSWERS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metrics.h"

namespace klserve::server {

// The bytes of the unary answers gRPC holds until their clients take them.
// A call gives its --max_concurrent_requests slot back once computed (a
// client that has its answer must find a slot free for its next call), but
// its answer stays in memory until its client reads it: a client that
// stopped reading (its flow-control window shut) made the server keep every
// answer it asked for. Past `max_bytes` of such answers new calls are
// refused, as at the limit of calls in flight (the clients retry), until
// answers are taken or cancelled (UnaryComputeCall: --stream_idle_timeout).
// Refusing rather than cancelling the oldest answer: a client reading a
// large answer over a slow link is no different, seen from here, from one
// that stopped.
class UnsentAnswers {
 public:
  // `metrics` (not owned) counts the refusals.
  UnsentAnswers(int64_t max_bytes, Metrics* metrics)
      : max_bytes_(max_bytes), metrics_(metrics) {}
  UnsentAnswers(const UnsentAnswers&) = delete;
  UnsentAnswers& operator=(const UnsentAnswers&) = delete;

  // OK while the answers waiting take less than max_bytes; else
  // RESOURCE_EXHAUSTED, marked for the clients' retry as Admission::Enter
  // marks its refusals.
  absl::Status Admit(grpc::CallbackServerContext& call);
  // An answer of `bytes` from when it is sent until its call is done.
  void Add(int64_t bytes);
  void Remove(int64_t bytes);

 private:
  const int64_t max_bytes_;
  Metrics* const metrics_;
  absl::Mutex mu_;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_UNSENT_ANSWERS_H_
