#ifndef KLSERVE_SERVER_SERVICE_IDLE_MEMORY_RELEASE_H_
#define KLSERVE_SERVER_SERVICE_IDLE_MEMORY_RELEASE_H_

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/open_calls.h"

namespace klserve::server {

// Gives the allocator's free memory back to the OS once no call has been open
// for a while (--release_memory_after_idle). The allocator keeps what a call
// freed, its messages' buffers most of all, for the next call: a training job
// calling every step gets them without page faults. That is right while
// calls come; after the last one it would keep a large request's memory in
// the process for good, which is what a node's memory accounting sees.
class IdleMemoryRelease {
 public:
  // Samples `activity` every `idle` and calls `release` whenever two
  // samples in a row saw no call open and the same count of ended calls
  // that move tensors: from one to two periods after the last such call
  // ended, then every period while none comes (a release with nothing free
  // costs next to nothing). Calls refused before they reach the service
  // (a message over the limit) are not counted, yet gRPC received their
  // bytes: releasing every idle period returns those too. Cheap calls
  // (GetServerInfo, FinishStep, the region RPCs) do not count either, so a
  // client polling them does not hold the memory.
  IdleMemoryRelease(absl::Duration idle,
                    std::function<OpenCalls::Activity()> activity,
                    std::function<void()> release);
  // Stops the thread.
  ~IdleMemoryRelease();
  IdleMemoryRelease(const IdleMemoryRelease&) = delete;
  IdleMemoryRelease& operator=(const IdleMemoryRelease&) = delete;

 private:
  void Loop();

  const absl::Duration idle_;
  const std::function<OpenCalls::Activity()> activity_;
  const std::function<void()> release_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_IDLE_MEMORY_RELEASE_H_
