#include "server/service/listener_watchdog.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace klserve::server {
namespace {

// The inode of the socket open as `fd`, or nullopt if fd is not a socket.
std::optional<unsigned long> SocketInode(int fd) {
  char target[64];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return std::nullopt;
  absl::string_view text(target, static_cast<size_t>(n));
  unsigned long inode = 0;
  if (!absl::ConsumePrefix(&text, "socket:[") ||
      !absl::ConsumeSuffix(&text, "]") || !absl::SimpleAtoi(text, &inode)) {
    return std::nullopt;
  }
  return inode;
}

// The port of an IPv4 or IPv6 socket address, or -1.
int PortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return -1;
}

// The local, or (peer) the remote, port of an IPv4 or IPv6 socket, or -1.
int PortOfSocket(int fd, bool peer = false) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  sockaddr* a = reinterpret_cast<sockaddr*>(&address);
  if ((peer ? getpeername(fd, a, &length) : getsockname(fd, a, &length)) != 0) {
    return -1;
  }
  return PortOf(address);
}

bool IsListening(int fd) {
  int listening = 0;
  socklen_t length = sizeof(listening);
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 &&
         listening != 0;
}

// Calls fn(fd, inode) for each socket this process has open, listed through
// `fds` (/proc/self/fd, opened once: with no descriptor left, as when gRPC's
// listener stopped, a new opendir would fail).
template <typename Fn>
void ForEachSocket(DIR* fds, Fn&& fn) {
  rewinddir(fds);
  const int own = dirfd(fds);
  while (const dirent* entry = readdir(fds)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == own) continue;
    if (const std::optional<unsigned long> inode = SocketInode(fd)) {
      fn(fd, *inode);
    }
  }
}

// The inodes of the accepted connections to `port`, sorted.
std::vector<unsigned long> AcceptedConnections(DIR* fds, int port) {
  std::vector<unsigned long> inodes;
  ForEachSocket(fds, [&](int fd, unsigned long inode) {
    if (PortOfSocket(fd) == port && !IsListening(fd)) inodes.push_back(inode);
  });
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

// Whether a connection from local port `from` to `port` is among this
// process's sockets: the listener took it.
bool Accepted(DIR* fds, int port, int from) {
  bool found = false;
  ForEachSocket(fds, [&](int fd, unsigned long) {
    found = found || (PortOfSocket(fd) == port &&
                      PortOfSocket(fd, /*peer=*/true) == from);
  });
  return found;
}

// How long a probe waits for its connection to be made, and then taken.
constexpr int kProbeConnectMs = 2000;
constexpr absl::Duration kProbeAcceptWait = absl::Seconds(3);

// Whether the listener `fd` on `port` takes a connection of this process's
// own within kProbeAcceptWait; nullopt when no probe could be made (no
// descriptor left, or the address refuses it). Connections waiting with
// none seen taken could also be a flood that gRPC takes and drops between
// looks, which the probe, held open, tells apart.
std::optional<bool> ProbeTakes(DIR* fds, int fd, int port) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return std::nullopt;
  }
  // A wildcard address is reached on loopback.
  if (address.ss_family == AF_INET) {
    auto& in = reinterpret_cast<sockaddr_in&>(address);
    if (in.sin_addr.s_addr == htonl(INADDR_ANY)) {
      in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
  } else if (address.ss_family == AF_INET6) {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(address);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr))
      in6.sin6_addr = in6addr_loopback;
  } else {
    return std::nullopt;
  }
  const int probe =
      socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (probe < 0) return std::nullopt;
  std::optional<bool> taken;
  if (connect(probe, reinterpret_cast<const sockaddr*>(&address), length) ==
          0 ||
      errno == EINPROGRESS) {
    pollfd ready = {.fd = probe, .events = POLLOUT, .revents = 0};
    int error = 0;
    socklen_t error_length = sizeof(error);
    if (poll(&ready, 1, kProbeConnectMs) != 1) {
      taken = false;  // the queue is full: nothing is taken from it
    } else if (getsockopt(probe, SOL_SOCKET, SO_ERROR, &error, &error_length) ==
                   0 &&
               error == 0) {
      const int from = PortOfSocket(probe);
      const absl::Time give_up = absl::Now() + kProbeAcceptWait;
      taken = false;
      while (!*taken && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(100));
        taken = Accepted(fds, port, from);
      }
    }
  }
  close(probe);
  return taken;
}

std::string OpenFileLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "unknown";
  return absl::StrCat(limit.rlim_cur);
}

}  // namespace

ListenerWatchdog::ListenerWatchdog(
    const std::vector<int>& ports, absl::Duration period, int patience,
    absl::AnyInvocable<void(std::string)> on_stuck)
    : period_(period),
      patience_(patience),
      on_stuck_(std::move(on_stuck)),
      fds_(opendir("/proc/self/fd")) {
  if (fds_ == nullptr) return;
  ForEachSocket(fds_, [&](int fd, unsigned long inode) {
    const int port = PortOfSocket(fd);
    if (port > 0 && IsListening(fd) &&
        std::find(ports.begin(), ports.end(), port) != ports.end()) {
      Listener listener;
      listener.fd = fd;
      listener.port = port;
      listener.inode = inode;
      listeners_.push_back(std::move(listener));
    }
  });
  if (!listeners_.empty()) thread_ = std::thread([this] { Run(); });
}

ListenerWatchdog::~ListenerWatchdog() { Stop(); }

void ListenerWatchdog::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (fds_ != nullptr) {
    closedir(fds_);
    fds_ = nullptr;
  }
}

bool ListenerWatchdog::LooksStuck(Listener& listener, int queued) {
  if (queued == 0) {
    listener.full_looks = 0;
    listener.connections.clear();
    return false;
  }
  std::vector<unsigned long> now = AcceptedConnections(fds_, listener.port);
  // A connection it did not have at the last look was accepted since.
  const bool accepted =
      !std::includes(listener.connections.begin(), listener.connections.end(),
                     now.begin(), now.end());
  listener.connections = std::move(now);
  listener.full_looks = accepted ? 0 : listener.full_looks + 1;
  if (listener.full_looks < patience_) return false;
  // A probe the listener takes clears it; one that cannot be made (no
  // descriptor left: what stops gRPC's listener) leaves the looks to decide.
  if (ProbeTakes(fds_, listener.fd, listener.port).value_or(false)) {
    listener.full_looks = 0;
    return false;
  }
  return true;
}

void ListenerWatchdog::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) return;
    }
    for (Listener& listener : listeners_) {
      if (SocketInode(listener.fd) != listener.inode) continue;  // closed
      tcp_info info = {};
      socklen_t length = sizeof(info);
      // A listening socket's tcpi_unacked is its accept queue's length.
      if (getsockopt(listener.fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) {
        continue;
      }
      const int queued = static_cast<int>(info.tcpi_unacked);
      if (LooksStuck(listener, queued)) {
        on_stuck_(absl::StrCat(
            "the gRPC listener on port ", listener.port,
            " has taken no connection for ",
            absl::FormatDuration(period_ * patience_), " while ", queued,
            " waited in its queue, nor one of this process's own: gRPC 1.51 "
            "stops accepting for good once an accept finds no file descriptor "
            "left (the open-file limit is ",
            OpenFileLimit(), ")"));
        return;
      }
    }
  }
}

}  // namespace klserve::server
