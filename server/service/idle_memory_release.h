#ifndef KLSERVE_SERVER_SERVICE_IDLE_MEMORY_RELEASE_H_
#define KLSERVE_SERVER_SERVICE_IDLE_MEMORY_RELEASE_H_

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
  // Looks at `calls` every `idle` and releases once it has seen no call open
  // and none ended for a whole period since the last release: between one
  // and two periods after the last call ended.
  IdleMemoryRelease(OpenCalls* calls, absl::Duration idle);
  // Stops the thread.
  ~IdleMemoryRelease();
  IdleMemoryRelease(const IdleMemoryRelease&) = delete;
  IdleMemoryRelease& operator=(const IdleMemoryRelease&) = delete;

 private:
  void Loop();

  OpenCalls* const calls_;
  const absl::Duration idle_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_IDLE_MEMORY_RELEASE_H_
