#ifndef KLSERVE_SERVER_CODEC_GRPC_STATUS_H_
#define KLSERVE_SERVER_CODEC_GRPC_STATUS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace klserve::server {

// The one place where an absl::Status becomes a grpc::Status. The codes share
// their numbers (checked at compile time in the .cc), so the code passes
// through unchanged, and so does the message up to kMaxStatusMessageBytes:
// a longer one is cut there and says so. The message travels in a trailer,
// and a client refuses trailers past its metadata limit (8 KiB by default),
// which would turn the answer into "Stream removed".
inline constexpr size_t kMaxStatusMessageBytes = 2048;
grpc::Status ToGrpcStatus(const absl::Status& status);

// `text` in double quotes for an error message, cut after 64 bytes (with
// how long it was), and with bytes outside printable ASCII escaped: a value
// a caller sent is quoted, never echoed whole.
std::string QuoteForMessage(absl::string_view text);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_CODEC_GRPC_STATUS_H_
