#ifndef KLSERVE_AUTH_TOKEN_FILE_H_
#define KLSERVE_AUTH_TOKEN_FILE_H_

// The bearer-token file that the server (klserve --auth_token_file) and
// klctl (klctl --auth_token_file) both read: one reader, so that a file one
// of them accepts the other reads as the same token.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace klserve {

// The longest token, in bytes. The token travels in every call's
// "authorization" header, and gRPC refuses a call whose headers pass its
// metadata limit (8 KiB by default); half of it leaves room for the rest.
inline constexpr size_t kMaxTokenBytes = 4096;

// The token in the file at `path`: its whole content, less any run of
// trailing "\n" and "\r" (an editor's final newline). INVALID_ARGUMENT
// naming --auth_token_file and the file when the file cannot be read, holds
// no token, or the token
//   - holds a byte outside printable ASCII (it goes in a gRPC header value),
//   - starts or ends with a space (an HTTP/2 header value cannot), or
//   - is longer than kMaxTokenBytes.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace klserve

#endif  // KLSERVE_AUTH_TOKEN_FILE_H_
