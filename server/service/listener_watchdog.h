#ifndef KLSERVE_SERVER_SERVICE_LISTENER_WATCHDOG_H_
#define KLSERVE_SERVER_SERVICE_LISTENER_WATCHDOG_H_

#include <dirent.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace klserve::server {

// gRPC 1.51 stops accepting on a TCP listener for good once an accept fails
// for want of file descriptors (EMFILE or ENFILE; grpc/grpc#16058): the
// kernel still completes each handshake and queues the connection, but no
// call on a new connection is ever served, while the process looks healthy
// to the connections it already has. A peer that opens connections up to
// the open-file limit, once, does it.
//
// ListenerWatchdog looks at this process's listening TCP sockets on `ports`
// once a `period`. A listener whose accept queue has held connections at
// `patience` looks in a row, with no new connection to its port among this
// process's descriptors in between, is probed: a connection of the
// watchdog's own, held open, must be taken within 3 s (a flood that gRPC
// takes and drops between looks passes that). One that is not taken, or
// cannot be made for want of a descriptor, makes the listener stuck:
// `on_stuck` is called once, with a sentence saying what was seen, and the
// watchdog stops looking. It needs no new descriptor to look.
class ListenerWatchdog {
 public:
  ListenerWatchdog(const std::vector<int>& ports, absl::Duration period,
                   int patience,
                   absl::AnyInvocable<void(std::string)> on_stuck);
  // Stop()s.
  ~ListenerWatchdog();
  ListenerWatchdog(const ListenerWatchdog&) = delete;
  ListenerWatchdog& operator=(const ListenerWatchdog&) = delete;

  // Stops looking and joins the thread, before the listeners close (their
  // descriptors could then be reused). Idempotent; not from on_stuck.
  void Stop();

  // How many listening sockets it found on the ports (tests).
  int listeners() const { return static_cast<int>(listeners_.size()); }

 private:
  struct Listener {
    int fd = -1;
    int port = 0;
    unsigned long inode = 0;  // the socket's, to tell a reused descriptor
    int full_looks = 0;       // looks in a row with a queue and no accept
    std::vector<unsigned long> connections;  // accepted ones, at the last look
  };
  void Run();
  // Whether this look finds `listener` stuck; updates its counts.
  bool LooksStuck(Listener& listener, int queued);

  const absl::Duration period_;
  const int patience_;
  absl::AnyInvocable<void(std::string)> on_stuck_;
  DIR* fds_;                         // /proc/self/fd, open from the start
  std::vector<Listener> listeners_;  // the thread's alone once it runs
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LISTENER_WATCHDOG_H_
