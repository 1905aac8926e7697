#ifndef KLSERVE_SERVER_SERVICE_LISTEN_ADDRESSES_H_
#define KLSERVE_SERVER_SERVICE_LISTEN_ADDRESSES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace klserve::server {

// One address of --listen: a TCP "HOST:PORT" or a Unix-domain socket
// "unix:/absolute/path" (also written "unix:///absolute/path").
struct ListenAddress {
  std::string address;      // as gRPC takes it
  std::string socket_path;  // the socket's path; empty for TCP
  bool is_unix() const { return !socket_path.empty(); }
};

// A TCP address as klserve serves it: "HOST:PORT", HOST a name, an IPv4
// address or a bracketed IPv6 address, PORT in [0, 65535] (0: any free
// port). INVALID_ARGUMENT naming --`flag` otherwise: a forgotten port would
// be gRPC's 443, or for /metrics civetweb's reading of a bare number.
absl::Status CheckHostPort(absl::string_view flag, absl::string_view address);

// Why a TCP socket cannot bind `host_port` ("HOST:PORT" as CheckHostPort
// takes it) now, as the system says it ("Address already in use", a name
// that does not resolve); empty when it binds. For the start-up error of a
// server that could not listen: gRPC and civetweb say why only in their
// logs, or in their own terms.
std::string WhyCannotBind(absl::string_view host_port);

// Splits --listen at commas. INVALID_ARGUMENT naming --listen for an empty
// list or entry, an address given twice, a relative socket path (it would
// depend on the directory klserve starts in), or one too long for a socket
// address (107 bytes).
absl::StatusOr<std::vector<ListenAddress>> ParseListenAddresses(
    absl::string_view flag);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LISTEN_ADDRESSES_H_
