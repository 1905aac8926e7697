#include "auth/token_file.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace klserve {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file: cannot read \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string token = buffer.str();
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
