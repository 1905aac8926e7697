#include "server/service/socket_file.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace klserve::server {
namespace {

std::string Quoted(const std::string& path) {
  return absl::StrCat("--listen: unix:", path);
}

// Whether a server accepts connections on the socket at `path`. Errors other
// than "nobody listens" are reported: they leave the question open. The
// connect does not block: a server whose backlog is full (stopped, or
// overloaded) answers EAGAIN, and still holds the path.
absl::StatusOr<bool> Answers(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(Quoted(path), ": socket: ", std::strerror(errno)));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const int result =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int error = errno;
  close(fd);
  if (result == 0 || error == EAGAIN) return true;
  if (error == ECONNREFUSED) return false;
  return absl::FailedPreconditionError(absl::StrCat(
      Quoted(path), ": cannot tell whether a server uses the socket there (",
      std::strerror(error), ")"));
}

// Creates the directories above `path` that do not exist yet.
absl::Status CreateParentDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string directory = path.substr(0, slash);
    if (mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
      const int error = errno;
      return absl::FailedPreconditionError(absl::StrCat(
          Quoted(path), ": cannot create the directory ", directory, ": ",
          std::strerror(error),
          error == EACCES ? "; choose a directory this user may write, such "
                            "as unix:/tmp/klserve/klserve.sock"
                          : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string BindingPath(const std::string& path) {
  return path + std::string(kBindingSuffix);
}

absl::Status ClaimSocketPath(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return CreateParentDirectories(path);
    return absl::FailedPreconditionError(
        absl::StrCat(Quoted(path), ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(Quoted(path),
                     ": the path exists and is not a socket; remove it or "
                     "choose another"));
  }
  absl::StatusOr<bool> answers = Answers(path);
  if (!answers.ok()) return answers.status();
  if (*answers) {
    return absl::UnavailableError(absl::StrCat(
        Quoted(path), ": another server is serving on this socket"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        Quoted(path),
        ": cannot remove the stale socket: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SocketFile>> SocketFile::Publish(
    const std::string& path, mode_t mode) {
  const std::string binding = BindingPath(path);
  struct stat info;
  if (lstat(binding.c_str(), &info) != 0 || !S_ISSOCK(info.st_mode)) {
    return absl::InternalError(absl::StrCat(Quoted(path), ": no socket at ",
                                            binding, " after binding"));
  }
  if (chmod(binding.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Quoted(path),
                     ": cannot set the socket's mode: ", std::strerror(errno)));
  }
  if (renameat2(AT_FDCWD, binding.c_str(), AT_FDCWD, path.c_str(),
                RENAME_NOREPLACE) != 0) {
    const int error = errno;
    unlink(binding.c_str());
    return error == EEXIST ? absl::UnavailableError(absl::StrCat(
                                 Quoted(path),
                                 ": another process claimed the path while "
                                 "klserve started"))
                           : absl::FailedPreconditionError(absl::StrCat(
                                 Quoted(path), ": cannot move the socket from ",
                                 binding, ": ", std::strerror(error)));
  }
  return std::unique_ptr<SocketFile>(
      new SocketFile(path, info.st_dev, info.st_ino));
}

SocketFile::~SocketFile() {
  struct stat info;
  if (lstat(path_.c_str(), &info) == 0 && info.st_dev == device_ &&
      info.st_ino == inode_) {
    unlink(path_.c_str());
  }
}

}  // namespace klserve::server
