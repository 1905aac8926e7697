#ifndef KLSERVE_SERVER_SERVICE_SOCKET_FILE_H_
#define KLSERVE_SERVER_SERVICE_SOCKET_FILE_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// The life of a --listen=unix: socket file. gRPC binds it at a side name
// (the path + kBindingSuffix) under a umask that lets only klserve's user
// in; once bound it gets --unix_socket_mode and is renamed onto its path,
// never over a file that appeared there meanwhile. So no one else can
// connect before the mode is set, and gRPC, which deletes the names it bound
// when it stops, never deletes a path a later server has claimed.

namespace klserve::server {

inline constexpr std::string_view kBindingSuffix = ".binding";

// Where gRPC binds the socket for `path`.
std::string BindingPath(const std::string& path);

// Before binding `path`: UNAVAILABLE if a running server answers on it,
// FAILED_PRECONDITION if something that is not a socket is there. A socket
// nobody answers on is left over from a server that died, and is removed.
// Missing directories above it are created (mode 0755, as systemd makes a
// RuntimeDirectory), so that unix:/run/klserve/klserve.sock works on a fresh
// host; one that cannot be is FAILED_PRECONDITION naming it.
absl::Status ClaimSocketPath(const std::string& path);

// A bound socket at its path, removed when this is destroyed if the path
// still names it.
class SocketFile {
 public:
  // Sets the mode of the socket gRPC bound at BindingPath(path) and renames
  // it onto `path`. `mode`: permission bits; connecting needs write
  // permission.
  static absl::StatusOr<std::unique_ptr<SocketFile>> Publish(
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
