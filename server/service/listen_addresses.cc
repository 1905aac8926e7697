#include "server/service/listen_addresses.h"

#include <sys/un.h>

#include <algorithm>

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

absl::Status CheckHostPort(absl::string_view flag, absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    // gRPC would take a bare host as port 443, civetweb a bare number as a
    // port on every interface: neither is what a forgotten port means.
    return Invalid(flag, "an address is HOST:PORT, its port included",
                   address);
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
