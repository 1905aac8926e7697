#include "server/codec/wire_messages.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace klserve::server {

absl::Status ParseMessage(const grpc::ByteBuffer& bytes, absl::string_view what,
                          google::protobuf::Message& message) {
  // The reader takes the buffer's slices by reference: no copy of the bytes.
  grpc::ByteBuffer view(bytes);
  grpc::ProtoBufferReader reader(&view);
  if (!reader.status().ok() || !message.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the ", bytes.Length(),
                     " bytes are not a parsable ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

absl::Status EncodeMessage(const google::protobuf::Message& message,
                           grpc::ByteBuffer& out) {
  out.Clear();
  grpc::ProtoBufferWriter writer(&out, grpc::kProtoBufferWriterMaxBufferLength,
                                 static_cast<int>(message.ByteSizeLong()));
  if (!message.SerializeToZeroCopyStream(&writer)) {
    return absl::InternalError(
        absl::StrCat("cannot encode a ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<grpc::ByteBuffer>> EncodeMessage(
    const google::protobuf::Message& message) {
  auto bytes = std::make_unique<grpc::ByteBuffer>();
  if (absl::Status s = EncodeMessage(message, *bytes); !s.ok()) return s;
  return bytes;
}

}  // namespace klserve::server
