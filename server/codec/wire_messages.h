#ifndef KLSERVE_SERVER_CODEC_WIRE_MESSAGES_H_
#define KLSERVE_SERVER_CODEC_WIRE_MESSAGES_H_

// The IndexerKl methods are registered raw (bytes in, bytes out): gRPC's own
// parsing answers bytes that are not a request with a bare UNIMPLEMENTED (a
// unary call) or takes them for the end of a stream. These parse and encode
// the messages instead, so that bad bytes get INVALID_ARGUMENT and every
// call is counted.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace klserve::server {

// Parses `bytes` into `message`; INVALID_ARGUMENT naming `what` (e.g.
// "ComputeLoss request") and the message type when they are not one.
absl::Status ParseMessage(const grpc::ByteBuffer& bytes, absl::string_view what,
                          google::protobuf::Message& message);

// `message` encoded into `out`, as gRPC sends it.
absl::Status EncodeMessage(const google::protobuf::Message& message,
                           grpc::ByteBuffer& out);

// The same in a buffer of its own (a stream's queued write).
absl::StatusOr<std::unique_ptr<grpc::ByteBuffer>> EncodeMessage(
    const google::protobuf::Message& message);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_CODEC_WIRE_MESSAGES_H_
