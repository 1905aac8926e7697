#include "server/service/unary_compute_call.h"

namespace klserve::server {

UnaryComputeCall::UnaryComputeCall(const ServiceContext& context,
                                   grpc::CallbackServerContext* call)
    : context_(context), call_(call) {
  context_.watchdog->Add(this);
}

void UnaryComputeCall::Answer(const grpc::Status& status,
                              int64_t response_bytes) {
  {
    absl::MutexLock lock(&mu_);
    answered_at_ = absl::Now();
  }
  if (status.ok()) {
    unsent_bytes_ = response_bytes;
    context_.unsent_answers->Add(unsent_bytes_);
  }
  Finish(status);
}

void UnaryComputeCall::Check(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (expired_ || !answered_at_.has_value() ||
        now - *answered_at_ < context_.options->stream_idle_timeout) {
      return;
    }
    expired_ = true;
  }
  context_.metrics->CancelledUntakenAnswer();
  // Safe: the call is not done (OnDone waits in Remove for this Check).
  call_->TryCancel();
}

void UnaryComputeCall::OnDone() {
  context_.watchdog->Remove(this);
  context_.unsent_answers->Remove(unsent_bytes_);
  delete this;
}

}  // namespace klserve::server
