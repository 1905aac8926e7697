#include "client/call_status.h"

namespace klserve {

absl::Status StatusFromCall(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      status.error_message() == "CANCELLED") {
    return absl::UnavailableError(
        "the server shut down before handling the call (gRPC: CANCELLED)");
  }
  // gRPC and absl number their codes alike, so the cast keeps the code.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace klserve
