#ifndef KLSERVE_SERVER_SERVICE_CALL_WATCHDOG_H_
#define KLSERVE_SERVER_SERVICE_CALL_WATCHDOG_H_

#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace klserve::server {

// One thread that looks at every watched call a few times per timeout, so
// that a stream whose client has gone quiet (--stream_idle_timeout) or that
// has run too long (--max_stream_duration), or a unary answer its client
// leaves untaken (--stream_idle_timeout), is ended even though gRPC would
// wait for it forever. The calls decide; this only wakes them.
class CallWatchdog {
 public:
  class Watched {
   public:
    virtual ~Watched() = default;
    // Called on the watchdog's thread, with the watchdog's lock held: never
    // during or after the Remove of this call.
    virtual void Check(absl::Time now) = 0;
  };

  // Checks every `period` (the caller picks a fraction of its timeouts).
  explicit CallWatchdog(absl::Duration period);
  // Stops the thread; every call must have been removed.
  ~CallWatchdog();
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  void Add(Watched* call);
  // Waits for a Check of `call` in progress to return.
  void Remove(Watched* call);

 private:
  void Loop();

  const absl::Duration period_;
  absl::Mutex mu_;
  absl::flat_hash_set<Watched*> calls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_CALL_WATCHDOG_H_
