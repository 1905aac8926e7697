#include "server/codec/grpc_status.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace klserve::server {

static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) ==
              grpc::StatusCode::INVALID_ARGUMENT);
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) ==
              grpc::StatusCode::RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              grpc::StatusCode::UNAUTHENTICATED);

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  absl::string_view message = status.message();
  std::string cut;
  if (message.size() > kMaxStatusMessageBytes) {
    cut = absl::StrCat(message.substr(0, kMaxStatusMessageBytes),
                       "... (message cut; ", message.size(), " bytes)");
    message = cut;
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(message));
}

std::string QuoteForMessage(absl::string_view text) {
  constexpr size_t kMaxQuoted = 64;
  std::string quoted =
      absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxQuoted)), "\"");
  if (text.size() > kMaxQuoted) {
    absl::StrAppend(&quoted, "... (", text.size(), " bytes)");
  }
  return quoted;
}

}  // namespace klserve::server
