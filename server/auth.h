#ifndef KLSERVE_SERVER_AUTH_H_
#define KLSERVE_SERVER_AUTH_H_

// Bearer-token authentication of the IndexerKl RPCs (--auth_token_file).
//
// Every IndexerKl handler asks TokenAuth::Check first; grpc.health.v1.Health
// is served by gRPC itself and never checked, so Kubernetes probes need no
// token. See docs/security.md.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace klserve::server {

// Reads a token file: its whole content, trailing "\n" / "\r\n" (any run of
// them) stripped. INVALID_ARGUMENT naming the file when it cannot be read,
// is empty, or the token holds bytes that cannot go in a gRPC header value
// (anything outside printable ASCII).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// True when `a` and `b` are equal, in time that depends only on their
// lengths (every byte is compared; no early exit on the first difference).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class TokenAuth {
 public:
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}

  // OK when the call's metadata carries `authorization: Bearer <token>`;
  // UNAUTHENTICATED saying what is missing or wrong otherwise (never the
  // token, or how much of it matched).
  absl::Status Check(const grpc::CallbackServerContext& context) const;

 private:
  std::string token_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_AUTH_H_
