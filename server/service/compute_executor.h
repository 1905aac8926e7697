#ifndef KLSERVE_SERVER_SERVICE_COMPUTE_EXECUTOR_H_
#define KLSERVE_SERVER_SERVICE_COMPUTE_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace klserve::server {

// Threads, made once, that run the requests' computations, so that gRPC's
// own threads only move messages. Each task drives the backend, which
// spreads the rows over its own pool; the executor's size bounds how many
// requests compute at once.
class ComputeExecutor {
 public:
  explicit ComputeExecutor(int threads);
  // Runs the queued tasks, then joins.
  ~ComputeExecutor();
  ComputeExecutor(const ComputeExecutor&) = delete;
  ComputeExecutor& operator=(const ComputeExecutor&) = delete;

  // Queues `task`; it runs on one of the executor's threads.
  void Submit(std::function<void()> task);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_COMPUTE_EXECUTOR_H_
