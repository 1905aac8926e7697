#include "auth/credential_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace klserve {
namespace {

absl::Status Unreadable(absl::string_view field, const std::string& path,
                        absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": cannot read \"", path, "\": ", why));
}

// Closes the descriptor on every return.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> ReadCredentialFile(absl::string_view field,
                                               const std::string& path,
                                               size_t max_bytes) {
  // stat first: opening some devices does something (a watchdog, a tape),
  // so what is not a regular file is never opened. The descriptor is
  // checked again, as the path may change in between; non-blocking, so
  // that a FIFO put there meanwhile does not wait for a writer.
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return Unreadable(field, path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Unreadable(field, path, "not a regular file");
  }
  const FileDescriptor fd(
      open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) return Unreadable(field, path, std::strerror(errno));
  if (fstat(fd.get(), &st) != 0) {
    return Unreadable(field, path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Unreadable(field, path, "not a regular file");
  }
  // procfs and sysfs files pass for regular ones, but they are the kernel's
  // (a token read from /proc/sys/kernel/hostname is anyone's guess).
  struct statfs fs;
  if (fstatfs(fd.get(), &fs) == 0 &&
      (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC)) {
    return Unreadable(field, path, "a file of procfs or sysfs");
  }
  // One byte past the bound tells a file at the bound from a longer one,
  // whatever st_size said when it was opened.
  std::string content(max_bytes + 1, '\0');
  size_t size = 0;
  while (size < content.size()) {
    const ssize_t n =
        read(fd.get(), content.data() + size, content.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Unreadable(field, path, std::strerror(errno));
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  if (size > max_bytes) {
    return Unreadable(field, path,
                      absl::StrCat("larger than ", max_bytes, " bytes"));
  }
  if (size == 0) return Unreadable(field, path, "empty");
  content.resize(size);
  return content;
}

absl::StatusOr<std::string> ReadPemFile(absl::string_view field,
                                        const std::string& path,
                                        PemContent content) {
  absl::StatusOr<std::string> read = ReadCredentialFile(field, path);
  if (!read.ok()) return read.status();
  const absl::string_view pem = *read;
  // A BEGIN line of the kind wanted: "-----BEGIN CERTIFICATE-----" (or the
  // older X509 and TRUSTED labels), or "-----BEGIN " ... "PRIVATE KEY-----"
  // (PKCS#8, RSA, EC) whose block is not encrypted: gRPC takes no
  // passphrase, and would refuse it only at the first handshake.
  constexpr absl::string_view kBegin = "-----BEGIN ";
  bool encrypted = false;
  for (size_t at = pem.find(kBegin); at != absl::string_view::npos;
       at = pem.find(kBegin, at + 1)) {
    const size_t end = pem.find("-----", at + kBegin.size());
    if (end == absl::string_view::npos) break;
    const absl::string_view label =
        pem.substr(at + kBegin.size(), end - at - kBegin.size());
    if (content == PemContent::kCertificates) {
      if (label == "CERTIFICATE" || label == "X509 CERTIFICATE" ||
          label == "TRUSTED CERTIFICATE") {
        return read;
      }
      continue;
    }
    if (!absl::EndsWith(label, "PRIVATE KEY")) continue;
    const size_t stop = pem.find("-----END", end);
    const absl::string_view block =
        pem.substr(end, stop == absl::string_view::npos ? stop : stop - end);
    if (label == "ENCRYPTED PRIVATE KEY" ||
        absl::StrContains(block, "Proc-Type: 4,ENCRYPTED")) {
      encrypted = true;
      continue;
    }
    return read;
  }
  if (encrypted) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"", path,
        "\" holds an encrypted private key, and gRPC takes no passphrase: "
        "decrypt it (openssl pkey -in KEY -out PLAIN)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": \"", path, "\" holds no PEM ",
      content == PemContent::kCertificates
          ? "certificate (a -----BEGIN CERTIFICATE----- block)"
          : "private key (a -----BEGIN ... PRIVATE KEY----- block)"));
}

}  // namespace klserve
