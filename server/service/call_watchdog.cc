#include "server/service/call_watchdog.h"

#include "absl/time/clock.h"

namespace klserve::server {

CallWatchdog::CallWatchdog(absl::Duration period)
    : period_(period), thread_([this] { Loop(); }) {}

CallWatchdog::~CallWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CallWatchdog::Add(Watched* call) {
  absl::MutexLock lock(&mu_);
  calls_.insert(call);
}

void CallWatchdog::Remove(Watched* call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
}

void CallWatchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) {
    const absl::Time now = absl::Now();
    for (Watched* call : calls_) call->Check(now);
  }
}

}  // namespace klserve::server
