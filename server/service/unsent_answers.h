#ifndef KLSERVE_SERVER_SERVICE_UNSENT_ANSWERS_H_
#define KLSERVE_SERVER_SERVICE_UNSENT_ANSWERS_H_

#include <grpcpp/grpcpp.h>

#include <list>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metrics.h"

namespace klserve::server {

// The unary answers gRPC holds until their clients take them. A client that
// stops reading (its flow-control window shut) leaves its answer in memory,
// up to a message each, after the call has given its compute slot back. At
// most `max` are kept: one more cancels the one waiting longest, which frees
// its bytes. A client that reads takes its answer within moments, so the
// one waiting longest is the likeliest to be a reader that stopped.
class UnsentAnswers {
 public:
  // `metrics` (not owned) counts the cancelled answers.
  UnsentAnswers(int max, Metrics* metrics) : max_(max), metrics_(metrics) {}
  UnsentAnswers(const UnsentAnswers&) = delete;
  UnsentAnswers& operator=(const UnsentAnswers&) = delete;

  // Before `call` sends its answer; Remove when the call is done.
  void Add(grpc::CallbackServerContext* call);
  void Remove(grpc::CallbackServerContext* call);

 private:
  const int max_;
  Metrics* const metrics_;
  absl::Mutex mu_;
  // Oldest first.
  std::list<grpc::CallbackServerContext*> waiting_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<grpc::CallbackServerContext*,
                      std::list<grpc::CallbackServerContext*>::iterator>
      where_ ABSL_GUARDED_BY(mu_);
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_UNSENT_ANSWERS_H_
