#ifndef KLSERVE_SERVER_GRPC_STATUS_H_
#define KLSERVE_SERVER_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace klserve::server {

// The one place where an absl::Status becomes a grpc::Status. The codes share
// their numbers (checked at compile time in the .cc), so the code and the
// message pass through unchanged.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_GRPC_STATUS_H_
