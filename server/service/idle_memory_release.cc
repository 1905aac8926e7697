#include "server/service/idle_memory_release.h"

#include <utility>

namespace klserve::server {

IdleMemoryRelease::IdleMemoryRelease(
    absl::Duration idle, std::function<OpenCalls::Activity()> activity,
    std::function<void()> release)
    : idle_(idle),
      activity_(std::move(activity)),
      release_(std::move(release)),
      thread_([this] { Loop(); }) {}

IdleMemoryRelease::~IdleMemoryRelease() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void IdleMemoryRelease::Loop() {
  OpenCalls::Activity before = activity_();
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), idle_)) {
    const OpenCalls::Activity now = activity_();
    if (now.open == 0 && now == before) release_();
    before = now;
  }
}

}  // namespace klserve::server
