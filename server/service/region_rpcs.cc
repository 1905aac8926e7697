#include "server/service/region_rpcs.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kernels/status_macros.h"
#include "klserve/v1/klserve.pb.h"
#include "server/codec/grpc_status.h"
#include "server/codec/wire_messages.h"

namespace klserve::server {
namespace {

// Refuses a region RPC the server cannot serve to this caller.
absl::Status CheckServed(const ServiceContext& ctx, absl::string_view method,
                         absl::string_view peer) {
  if (ctx.regions == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        method, ": shared-memory regions are off on this server (start ",
        "klserve with --shared_memory)"));
  }
  if (!IsLocalPeer(peer)) {
    return absl::PermissionDeniedError(absl::StrCat(
        method, ": only callers on this host (a Unix socket or loopback) ",
        "may use shared-memory regions, got a call from ",
        QuoteForMessage(peer)));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLocalPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") ||
      absl::StartsWith(peer, "unix-abstract:")) {
    return true;
  }
  if (absl::StartsWith(peer, "ipv4:127.")) return true;
  // gRPC writes an IPv6 peer as ipv6:[::1]:port, with the brackets
  // percent-encoded in newer releases; an IPv4-mapped loopback counts.
  for (absl::string_view open : {"[", "%5B", "%5b"}) {
    const std::string prefix = absl::StrCat("ipv6:", open);
    if (!absl::StartsWith(peer, prefix)) continue;
    const absl::string_view host = peer.substr(prefix.size());
    return absl::StartsWith(host, "::1]") || absl::StartsWith(host, "::1%5") ||
           absl::StartsWith(host, "::ffff:127.");
  }
  return false;
}

absl::Status RegisterRegion(const ServiceContext& ctx, absl::string_view peer,
                            const grpc::ByteBuffer& request,
                            grpc::ByteBuffer& response) {
  RETURN_IF_ERROR(CheckServed(ctx, "RegisterRegion", peer));
  v1::RegisterRegionRequest parsed;
  RETURN_IF_ERROR(ParseMessage(request, "RegisterRegion request", parsed));
  ASSIGN_OR_RETURN(const absl::Duration lease,
                   ctx.regions->Register(parsed.name(), parsed.key(),
                                         parsed.offset(), parsed.byte_size()));
  v1::RegisterRegionResponse registered;
  registered.set_lease_seconds(absl::ToInt64Seconds(lease));
  return EncodeMessage(registered, response);
}

absl::Status UnregisterRegion(const ServiceContext& ctx, absl::string_view peer,
                              const grpc::ByteBuffer& request,
                              grpc::ByteBuffer& response) {
  RETURN_IF_ERROR(CheckServed(ctx, "UnregisterRegion", peer));
  v1::UnregisterRegionRequest parsed;
  RETURN_IF_ERROR(ParseMessage(request, "UnregisterRegion request", parsed));
  RETURN_IF_ERROR(ctx.regions->Unregister(parsed.name()));
  return EncodeMessage(v1::UnregisterRegionResponse(), response);
}

absl::Status ListRegions(const ServiceContext& ctx, absl::string_view peer,
                         const grpc::ByteBuffer& request,
                         grpc::ByteBuffer& response) {
  RETURN_IF_ERROR(CheckServed(ctx, "ListRegions", peer));
  v1::ListRegionsRequest parsed;
  RETURN_IF_ERROR(ParseMessage(request, "ListRegions request", parsed));
  v1::ListRegionsResponse list;
  for (const RegionStatusInfo& info : ctx.regions->List()) {
    v1::RegionStatus* region = list.add_regions();
    region->set_name(info.name);
    region->set_key(info.key);
    region->set_offset(info.offset);
    region->set_byte_size(info.byte_size);
    region->set_users(info.users);
    region->set_lease_left_seconds(absl::ToInt64Seconds(info.lease_left));
  }
  list.set_max_regions(ctx.regions->limits().max_regions);
  list.set_max_region_bytes(ctx.regions->limits().max_bytes);
  return EncodeMessage(list, response);
}

}  // namespace klserve::server
