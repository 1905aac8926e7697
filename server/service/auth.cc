#include "server/service/auth.h"

#include <cstddef>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/codec/grpc_status.h"
#include "server/service/method_names.h"

namespace klserve::server {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // The lengths differing is the one thing an early answer could reveal;
  // the loop still runs over all of `a`, so the time depends on the lengths
  // alone, never on where the bytes differ.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char other =
        i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(a[i]) ^ other;
  }
  // Keeps the compiler from turning the loop into an early-exit comparison.
  volatile unsigned char result = diff;
  return result == 0;
}

absl::Status TokenAuth::Check(const InputMetadata& metadata) const {
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing \"authorization: Bearer <token>\" metadata (this server "
        "requires a token: klctl --auth_token_file, Python "
        "Client(auth_token=...), C++ ClientOptions::auth_token)");
  }
  const absl::string_view value(found->second.data(), found->second.size());
  constexpr absl::string_view kScheme = "Bearer ";
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(
        "\"authorization\" metadata is not \"Bearer <token>\"");
  }
  if (!ConstantTimeEquals(token_, value.substr(kScheme.size()))) {
    return absl::UnauthenticatedError(
        "wrong token in the \"authorization: Bearer\" metadata");
  }
  return absl::OkStatus();
}

grpc::Status TokenAuth::Process(const InputMetadata& metadata,
                                grpc::AuthContext*, OutputMetadata*,
                                OutputMetadata*) {
  const auto path = metadata.find(":path");
  const absl::string_view method =
      path == metadata.end()
          ? absl::string_view()
          : absl::string_view(path->second.data(), path->second.size());
  if (!health_needs_token_ &&
      absl::StartsWith(method, "/grpc.health.v1.Health/")) {
    return grpc::Status::OK;
  }
  const absl::Status status = Check(metadata);
  if (status.ok()) return grpc::Status::OK;
  if (absl::StartsWith(method, kIndexerKlPrefix) &&
      IsIndexerKlMethod(method.substr(kIndexerKlPrefix.size()))) {
    metrics_->RecordRequest(method.substr(kIndexerKlPrefix.size()),
                            absl::StatusCodeToString(status.code()), 0, 0, 0,
                            0);
  }
  return ToGrpcStatus(status);
}

}  // namespace klserve::server
