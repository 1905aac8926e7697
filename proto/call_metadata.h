#ifndef KLSERVE_PROTO_CALL_METADATA_H_
#define KLSERVE_PROTO_CALL_METADATA_H_

namespace klserve {

// The API's metadata beyond its messages (klserve.proto, IndexerKl).
//
// Trailing metadata of a call the server refused with RESOURCE_EXHAUSTED
// because it was at its limit of calls in flight (--max_concurrent_requests,
// --max_open_streams): the call did not run, and may be sent again after a
// backoff. Its value names the flag. The other RESOURCE_EXHAUSTED refusals
// (a message or tensor past a size limit) do not carry it: sent again, they
// fail again.
inline constexpr char kOverloadedMetadataKey[] = "klserve-overloaded";

}  // namespace klserve

#endif  // KLSERVE_PROTO_CALL_METADATA_H_
