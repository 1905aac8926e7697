#include "server/echo_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace klserve::server {

EchoReactor* EchoReactor::Start(const ServiceContext& context,
                                grpc::CallbackServerContext*) {
  auto* reactor = new EchoReactor(context);
  reactor->Begin();
  return reactor;
}

void EchoReactor::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  reading_ = false;
  if (finishing_) return;
  if (!ok) {
    reads_done_ = true;
  } else {
    bytes_in_ += static_cast<int64_t>(incoming_.ByteSizeLong());
    const int64_t bytes = incoming_.reply_bytes();
    if (bytes < 0 || bytes > context_.options->max_message_bytes) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("reply_bytes: must be in [0, ",
                       context_.options->max_message_bytes, "], got ", bytes)));
      return;
    }
    auto reply = std::make_unique<v1::EchoResponse>();
    reply->mutable_payload()->resize(bytes);
    writes_.push_back(std::move(reply));
    incoming_.Clear();
  }
  Advance();
}

void EchoReactor::Advance() {
  if (finishing_) return;
  WriteNext();
  ReadNext(WritesHeld(), kMaxInFlight);
  if (reads_done_ && WritesHeld() == 0) FinishOk();
}

}  // namespace klserve::server
