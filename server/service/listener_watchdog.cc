#include "server/service/listener_watchdog.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
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

// The local TCP or UDP port of an IPv4 or IPv6 socket, or -1.
int LocalPort(int fd) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return -1;
}

bool IsListening(int fd) {
  int listening = 0;
  socklen_t length = sizeof(listening);
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 &&
         listening != 0;
}

// Calls fn(fd, inode) for each socket this process has open. False when
// the descriptors could not be listed (none left to open the list with).
template <typename Fn>
bool ForEachSocket(Fn&& fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  const int own = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == own) continue;
    if (const std::optional<unsigned long> inode = SocketInode(fd)) {
      fn(fd, *inode);
    }
  }
  closedir(dir);
  return true;
}

// The inodes of the accepted connections to `port`, sorted.
std::optional<std::vector<unsigned long>> AcceptedConnections(int port) {
  std::vector<unsigned long> inodes;
  if (!ForEachSocket([&](int fd, unsigned long inode) {
        if (LocalPort(fd) == port && !IsListening(fd)) inodes.push_back(inode);
      })) {
    return std::nullopt;
  }
  std::sort(inodes.begin(), inodes.end());
  return inodes;
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
    : period_(period), patience_(patience), on_stuck_(std::move(on_stuck)) {
  ForEachSocket([&](int fd, unsigned long inode) {
    const int port = LocalPort(fd);
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
}

bool ListenerWatchdog::LooksStuck(Listener& listener, int queued) {
  if (queued == 0) {
    listener.full_looks = 0;
    listener.connections.clear();
    return false;
  }
  std::optional<std::vector<unsigned long>> now =
      AcceptedConnections(listener.port);
  if (!now.has_value()) return false;  // no descriptor to look with
  // A connection it did not have at the last look was accepted since.
  const bool accepted =
      !std::includes(listener.connections.begin(), listener.connections.end(),
                     now->begin(), now->end());
  listener.connections = *std::move(now);
  listener.full_looks = accepted ? 0 : listener.full_looks + 1;
  return listener.full_looks >= patience_;
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
            " waited in its queue: gRPC 1.51 stops accepting for good once "
            "an accept finds no file descriptor left (the open-file limit is ",
            OpenFileLimit(), ")"));
        return;
      }
    }
  }
}

}  // namespace klserve::server
