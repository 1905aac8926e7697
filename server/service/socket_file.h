#ifndef KLSERVE_SERVER_SERVICE_SOCKET_FILE_H_
#define KLSERVE_SERVER_SERVICE_SOCKET_FILE_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace klserve::server {

// Before binding `path`: UNAVAILABLE if a running server answers on it (gRPC
// would otherwise replace its socket and take its clients),
// FAILED_PRECONDITION if something that is not a socket is there. A socket
// nobody answers on is left over from a server that died, and is removed.
absl::Status ClaimSocketPath(const std::string& path);

// The socket file of one bound --listen=unix: address. Its mode is set once
// bound; it is removed when this is destroyed, if the path still names the
// same file (a server started since may have claimed the path).
class SocketFile {
 public:
  // `mode`: permission bits; connecting needs write permission.
  static absl::StatusOr<std::unique_ptr<SocketFile>> Bound(
      const std::string& path, mode_t mode);
  ~SocketFile();
  SocketFile(const SocketFile&) = delete;
  SocketFile& operator=(const SocketFile&) = delete;

 private:
  SocketFile(std::string path, dev_t device, ino_t inode)
      : path_(std::move(path)), device_(device), inode_(inode) {}

  const std::string path_;
  const dev_t device_;
  const ino_t inode_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_SOCKET_FILE_H_
