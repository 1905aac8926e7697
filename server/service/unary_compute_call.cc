#include "server/service/unary_compute_call.h"

namespace klserve::server {

UnaryComputeCall::UnaryComputeCall(const ServiceContext& context,
                                   grpc::CallbackServerContext* call)
    : context_(context), call_(call) {
  context_.watchdog->Add(this);
}

void UnaryComputeCall::Answer(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    answered_at_ = absl::Now();
  }
  // A status alone is small; counting it would let a flood of refusals
  // cancel the answers other clients are taking.
  if (status.ok()) context_.unsent_answers->Add(call_);
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
  context_.metrics->CancelledUnsentAnswer("stream_idle_timeout");
  // Safe: the call is not done (OnDone waits in Remove for this Check).
  call_->TryCancel();
}

void UnaryComputeCall::OnDone() {
  context_.watchdog->Remove(this);
  context_.unsent_answers->Remove(call_);
  delete this;
}

}  // namespace klserve::server
