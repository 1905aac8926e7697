#ifndef KLSERVE_SERVER_SERVICE_REGION_RPCS_H_
#define KLSERVE_SERVER_SERVICE_REGION_RPCS_H_

// RegisterRegion, UnregisterRegion and ListRegions: bytes in, bytes out,
// on the registry of the ServiceContext.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/service/service_context.h"

namespace klserve::server {

// Whether gRPC's peer string names a caller on this host: a Unix socket or
// a loopback address. Only such a caller can have made the object it
// names, and only it may ask the server to map one.
bool IsLocalPeer(absl::string_view peer);

// Each: UNIMPLEMENTED when the server serves no regions, PERMISSION_DENIED
// for a caller that is not local (`peer`), else the registry's answer.
absl::Status RegisterRegion(const ServiceContext& ctx, absl::string_view peer,
                            const grpc::ByteBuffer& request,
                            grpc::ByteBuffer& response);
absl::Status UnregisterRegion(const ServiceContext& ctx, absl::string_view peer,
                              const grpc::ByteBuffer& request,
                              grpc::ByteBuffer& response);
absl::Status ListRegions(const ServiceContext& ctx, absl::string_view peer,
                         const grpc::ByteBuffer& request,
                         grpc::ByteBuffer& response);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_REGION_RPCS_H_
