#ifndef KLSERVE_SERVER_SERVICE_STREAM_WATCHDOG_H_
#define KLSERVE_SERVER_SERVICE_STREAM_WATCHDOG_H_

#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace klserve::server {

// One thread that looks at every open stream a few times per timeout, so
// that a stream whose client has gone quiet (--stream_idle_timeout) or that
// has run too long (--max_stream_duration) is ended even though gRPC would
// wait for it forever. The streams decide; this only wakes them.
class StreamWatchdog {
 public:
  class Watched {
   public:
    virtual ~Watched() = default;
    // Called on the watchdog's thread, with the watchdog's lock held: never
    // during or after the Remove of this stream.
    virtual void Check(absl::Time now) = 0;
  };

  // Checks every `period` (the caller picks a fraction of its timeouts).
  explicit StreamWatchdog(absl::Duration period);
  // Stops the thread; every stream must have been removed.
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  void Add(Watched* stream);
  // Waits for a Check of `stream` in progress to return.
  void Remove(Watched* stream);

 private:
  void Loop();

  const absl::Duration period_;
  absl::Mutex mu_;
  absl::flat_hash_set<Watched*> streams_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_STREAM_WATCHDOG_H_
