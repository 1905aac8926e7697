#ifndef KLSERVE_SERVER_SERVICE_AUTH_H_
#define KLSERVE_SERVER_SERVICE_AUTH_H_

// Bearer-token authentication (--auth_token_file, read by
// auth/token_file.h).
//
// The token is checked by gRPC's auth filter on a call's headers, before any
// of its message is read and before a handler or an admission slot is
// involved: an unauthenticated peer's call of a method that needs the token
// is held only for the moment its headers are parsed. Every method needs
// the token except grpc.health.v1.Health (Kubernetes probes carry no
// secrets), unless --health_needs_token; server reflection needs it too.
// A health call without the token is received like any call, message and
// all (gRPC takes a message in whole before it applies the size limit), so
// that is what the flag is for. See docs/security.md.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "server/metrics/metrics.h"

namespace klserve::server {

// True when `a` and `b` are equal, in time that depends only on their
// lengths (every byte is compared; no early exit on the first difference).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The token check, as gRPC's AuthMetadataProcessor: set on the listening
// port's credentials (ServerCredentials::SetAuthMetadataProcessor).
class TokenAuth final : public grpc::AuthMetadataProcessor {
 public:
  // `metrics` (not owned, outliving this) counts each refused IndexerKl call
  // under its method with code UNAUTHENTICATED. Health calls are let
  // through without the token unless `health_needs_token`.
  TokenAuth(std::string token, bool health_needs_token, Metrics* metrics)
      : token_(std::move(token)),
        health_needs_token_(health_needs_token),
        metrics_(metrics) {}

  // OK when `metadata` carries `authorization: Bearer <token>`;
  // UNAUTHENTICATED saying what is missing or wrong otherwise (never the
  // token, or how much of it matched).
  absl::Status Check(const InputMetadata& metadata) const;

  // Runs on the transport's thread: the check is a few comparisons.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*,
                       OutputMetadata* consumed,
                       OutputMetadata* response) override;

 private:
  const std::string token_;
  const bool health_needs_token_;
  Metrics* const metrics_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_AUTH_H_
