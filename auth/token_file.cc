#include "auth/token_file.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "auth/credential_file.h"
#include "kernels/status_macros.h"

namespace klserve {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  // Past this the token is refused for its length below; more is not read.
  constexpr size_t kMaxFileBytes = 16 * kMaxTokenBytes;
  ASSIGN_OR_RETURN(std::string token, ReadCredentialFile("--auth_token_file",
                                                         path, kMaxFileBytes));
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) {
    token.pop_back();
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file: \"", path, "\" holds no token"));
  }
  for (const char c : token) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_token_file: the token in \"", path,
          "\" must be printable ASCII (it goes in a gRPC header)"));
    }
  }
  if (token.front() == ' ' || token.back() == ' ') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_token_file: the token in \"", path,
        "\" must not start or end with a space (an HTTP/2 header value "
        "cannot)"));
  }
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_token_file: the token in \"", path, "\" must be at most ",
        kMaxTokenBytes, " bytes (it goes in every call's headers), got ",
        token.size()));
  }
  return token;
}

}  // namespace klserve
