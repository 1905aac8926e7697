#include "server/service/listen_addresses.h"

#include <sys/un.h>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/service/socket_file.h"

namespace klserve::server {
namespace {

absl::Status Invalid(absl::string_view rule, absl::string_view got) {
  // An address is the operator's own text: quoted whole, but never much.
  constexpr size_t kMaxQuoted = 256;
  return absl::InvalidArgumentError(
      absl::StrCat("--listen: ", rule, ", got \"", got.substr(0, kMaxQuoted),
                   got.size() > kMaxQuoted ? "...\"" : "\""));
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
