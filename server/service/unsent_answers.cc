#include "server/service/unsent_answers.h"

namespace klserve::server {

void UnsentAnswers::Add(grpc::CallbackServerContext* call) {
  absl::MutexLock lock(&mu_);
  where_[call] = waiting_.insert(waiting_.end(), call);
  while (static_cast<int>(waiting_.size()) > max_) {
    grpc::CallbackServerContext* oldest = waiting_.front();
    where_.erase(oldest);
    waiting_.pop_front();
    metrics_->CancelledUnsentAnswer("max_concurrent_requests");
    // Safe: that call is not done, as its Remove waits for this lock.
    oldest->TryCancel();
  }
}

void UnsentAnswers::Remove(grpc::CallbackServerContext* call) {
  absl::MutexLock lock(&mu_);
  if (auto it = where_.find(call); it != where_.end()) {
    waiting_.erase(it->second);
    where_.erase(it);
  }
}

}  // namespace klserve::server
