#include "server/service/stream_watchdog.h"

#include "absl/time/clock.h"

namespace klserve::server {

StreamWatchdog::StreamWatchdog(absl::Duration period)
    : period_(period), thread_([this] { Loop(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StreamWatchdog::Add(Watched* stream) {
  absl::MutexLock lock(&mu_);
  streams_.insert(stream);
}

void StreamWatchdog::Remove(Watched* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

void StreamWatchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) {
    const absl::Time now = absl::Now();
    for (Watched* stream : streams_) stream->Check(now);
  }
}

}  // namespace klserve::server
