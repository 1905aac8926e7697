#include "server/service/listen_addresses.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/service/socket_file.h"

namespace klserve::server {
namespace {

absl::Status Invalid(absl::string_view flag, absl::string_view rule,
                     absl::string_view got) {
  // An address is the operator's own text: quoted whole, but never much.
  constexpr size_t kMaxQuoted = 256;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, ": ", rule, ", got \"", got.substr(0, kMaxQuoted),
      got.size() > kMaxQuoted ? "...\"" : "\""));
}

absl::Status Invalid(absl::string_view rule, absl::string_view got) {
  return Invalid("listen", rule, got);
}

// The path with repeated and trailing slashes and "." parts removed, so that
// two spellings of one socket are seen as one.
std::string LexicalPath(absl::string_view path) {
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (!part.empty() && part != ".") parts.push_back(part);
  }
  return absl::StrCat("/", absl::StrJoin(parts, "/"));
}

}  // namespace

std::string WhyCannotBind(absl::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos) return "";
  std::string host(host_port.substr(0, colon));
  const std::string port(host_port.substr(colon + 1));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                    port.c_str(), &hints, &found);
      error != 0) {
    return absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(error));
  }
  // Every address the name stands for (localhost: ::1 and 127.0.0.1) must
  // bind; the first that cannot says why.
  std::string why;
  for (const addrinfo* a = found; a != nullptr && why.empty(); a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;  // a family this host lacks (IPv6 off) is no reason
    // As servers bind: a port in TIME_WAIT is free to them.
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::generic_category().message(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  return why;
}

absl::Status CheckHostPort(absl::string_view flag, absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    // gRPC would take a bare host as port 443, civetweb a bare number as a
    // port on every interface: neither is what a forgotten port means.
    return Invalid(flag, "an address is HOST:PORT, its port included", address);
  }
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (host.empty() ||
      (absl::StrContains(host, ':') &&
       !(absl::StartsWith(host, "[") && absl::EndsWith(host, "]")))) {
    return Invalid(flag,
                   "HOST is a name or an IPv4 address, or an IPv6 address "
                   "in brackets ([::1]:50051)",
                   address);
  }
  int value = 0;
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &value) || value > 65535) {
    return Invalid(flag, "PORT is a number in [0, 65535] (0: any free port)",
                   address);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ListenAddress>> ParseListenAddresses(
    absl::string_view flag) {
  std::vector<ListenAddress> addresses;
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    if (entry.empty()) {
      return Invalid(
          "every comma-separated address must be non-empty (HOST:PORT or "
          "unix:/path)",
          flag);
    }
    ListenAddress address;
    address.address = std::string(entry);
    absl::string_view path = entry;
    // Other gRPC schemes (unix-abstract:, vsock:, a resolver's URI) are not
    // served: an abstract socket has no file, so no mode protects it.
    if (!absl::StartsWith(entry, "unix:") &&
        (absl::StartsWith(entry, "unix-") || absl::StrContains(entry, "://") ||
         absl::StartsWith(entry, "vsock:"))) {
      return Invalid("an address is HOST:PORT or unix:/absolute/path", entry);
    }
    if (absl::ConsumePrefix(&path, "unix:")) {
      // gRPC's two spellings of an absolute path.
      absl::ConsumePrefix(&path, "//");
      if (!absl::StartsWith(path, "/")) {
        return Invalid("a socket path must be absolute (unix:/dir/name.sock)",
                       entry);
      }
      // gRPC binds at the path plus kBindingSuffix first (socket_file.h).
      constexpr size_t kMaxPath =
          sizeof(sockaddr_un{}.sun_path) - 1 - kBindingSuffix.size();
      if (path.size() > kMaxPath) {
        return Invalid(
            absl::StrCat("a socket path must be at most ", kMaxPath, " bytes"),
            entry);
      }
      address.socket_path = LexicalPath(path);
    } else if (absl::Status status = CheckHostPort("listen", entry);
               !status.ok()) {
      return status;
    }
    const std::string key =
        address.is_unix() ? address.socket_path : address.address;
    if (!seen.insert(key).second) {
      return Invalid("each address may be given once", entry);
    }
    addresses.push_back(std::move(address));
  }
  return addresses;
}

}  // namespace klserve::server
