#ifndef KLSERVE_CLIENT_CALL_STATUS_H_
#define KLSERVE_CLIENT_CALL_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "absl/status/status.h"

namespace klserve {

// The status a finished call reports to the client's caller: gRPC's code
// and message, with one exception. A call that reaches a server as it shuts
// down, before any handler took it, ends CANCELLED with gRPC's bare message
// "CANCELLED" (grpc/grpc#41785). Nothing of it ran, so it becomes
// UNAVAILABLE, which the client retries. This relies on the client never
// reporting a cancel of its own through here: it cancels only after a local
// error, and reports that error instead.
//
// A refusal at the server's limit of calls in flight (its trailing metadata
// carries kOverloadedMetadataKey) gets a payload that IsOverloaded reads.
absl::Status StatusFromCall(const grpc::Status& status,
                            const grpc::ClientContext& context);

// Whether `status` is a refusal at the server's limit of calls in flight:
// the call did not run, and the client retries it as it does UNAVAILABLE.
bool IsOverloaded(const absl::Status& status);

// An UNAVAILABLE that gRPC reports as a bare transport failure ("Socket
// closed", a failed handshake) is what a TLS mismatch looks like from the
// client: `status` with the likely cause and the option that fixes it
// appended, given whether the client speaks TLS (`tls`) and offers a
// certificate (`client_certificate`). Other statuses come back unchanged.
absl::Status ExplainUnavailable(const absl::Status& status, bool tls,
                                bool client_certificate);

// gRPC's RESOURCE_EXHAUSTED for a message past a size limit ("Received
// message larger than max (N vs. LIMIT)") with whose limit it met (the
// server's --max_message_bytes, or this client's `max_message_bytes`) and
// the way past it, streaming, appended. Other statuses come back unchanged.
absl::Status ExplainMessageLimit(const absl::Status& status,
                                 int64_t max_message_bytes);

}  // namespace klserve

#endif  // KLSERVE_CLIENT_CALL_STATUS_H_
