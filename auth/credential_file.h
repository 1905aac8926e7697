#ifndef KLSERVE_AUTH_CREDENTIAL_FILE_H_
#define KLSERVE_AUTH_CREDENTIAL_FILE_H_

// The files a server or client is pointed at for its credentials (a bearer
// token, TLS certificates and keys) are read through one bounded reader:
// the path comes from a flag, and a flag pointing at /dev/zero must not
// fill the memory, nor one pointing at a FIFO block the start forever.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace klserve {

// The largest credential file read: a PEM chain of a few dozen
// certificates.
inline constexpr size_t kMaxCredentialFileBytes = size_t{1} << 20;

// The whole content of the regular file at `path` (a symlink to one counts,
// as Kubernetes mounts its secrets). INVALID_ARGUMENT naming `field` and the
// path when it cannot be opened, is not a regular file (a FIFO, a device, a
// directory), is on procfs or sysfs, is empty, or holds more than
// `max_bytes` bytes.
absl::StatusOr<std::string> ReadCredentialFile(
    absl::string_view field, const std::string& path,
    size_t max_bytes = kMaxCredentialFileBytes);

// What a PEM file of TLS credentials must hold.
enum class PemContent {
  kCertificates,  // one or more "-----BEGIN CERTIFICATE-----" blocks
  kPrivateKey,    // a "-----BEGIN [...]PRIVATE KEY-----" block
};

// ReadCredentialFile, and INVALID_ARGUMENT naming `field` and the path when
// the file holds no PEM block of `content`: gRPC would take it, fail its
// TLS handshakes, and say only that no address worked.
absl::StatusOr<std::string> ReadPemFile(absl::string_view field,
                                        const std::string& path,
                                        PemContent content);

}  // namespace klserve

#endif  // KLSERVE_AUTH_CREDENTIAL_FILE_H_
