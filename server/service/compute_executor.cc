#include "server/service/compute_executor.h"

#include <utility>

namespace klserve::server {

ComputeExecutor::ComputeExecutor(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ComputeExecutor::~ComputeExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void ComputeExecutor::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void ComputeExecutor::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ComputeExecutor* e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return e->stopping_ || !e->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace klserve::server
