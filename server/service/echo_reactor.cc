#include "server/service/echo_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "server/codec/wire_messages.h"
#include "server/service/limits.h"

namespace klserve::server {

EchoReactor* EchoReactor::Start(const ServiceContext& context,
                                grpc::CallbackServerContext* call) {
  auto* reactor = new EchoReactor(context, call);
  reactor->Begin();
  return reactor;
}

absl::Status EchoReactor::OnMessage() {
  const int64_t bytes = incoming_.reply_bytes();
  incoming_.Clear();
  if (bytes < 0 || bytes > context_.options->max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reply_bytes: must be in [0, ", context_.options->max_message_bytes,
        "] (--max_message_bytes; a reply that its framing takes "
        "past the limit is RESOURCE_EXHAUSTED), got ",
        bytes));
  }
  v1::EchoResponse reply;
  reply.mutable_payload()->resize(bytes);
  RETURN_IF_ERROR(CheckMessageBytes(
      "reply_bytes", static_cast<int64_t>(reply.ByteSizeLong()),
      "ask for a smaller reply", *context_.options));
  ASSIGN_OR_RETURN(std::unique_ptr<grpc::ByteBuffer> encoded,
                   EncodeMessage(reply));
  Queue(std::move(encoded));
  return absl::OkStatus();
}

void EchoReactor::Advance() {
  if (finishing_) return;
  WriteNext();
  ReadNext(WritesHeld(), kMaxInFlight);
  if (reads_done_ && WritesHeld() == 0) FinishOk();
}

}  // namespace klserve::server
