#include "server/service/idle_memory_release.h"

#include <cstdint>
#include <limits>

#include "kernels/cpu/return_memory.h"

namespace klserve::server {

IdleMemoryRelease::IdleMemoryRelease(OpenCalls* calls, absl::Duration idle)
    : calls_(calls), idle_(idle), thread_([this] { Loop(); }) {}

IdleMemoryRelease::~IdleMemoryRelease() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void IdleMemoryRelease::Loop() {
  // At the start there is nothing a call has freed.
  OpenCalls::Activity released = calls_->Now();
  OpenCalls::Activity before = released;
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), idle_)) {
    const OpenCalls::Activity now = calls_->Now();
    if (now.open == 0 && now == before && now.ended != released.ended) {
      cpu::ReturnFreedMemory(std::numeric_limits<int64_t>::max());
      released = now;
    }
    before = now;
  }
}

}  // namespace klserve::server
