#include "server/echo_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc_status.h"

namespace klserve::server {

EchoReactor* EchoReactor::Start(const ServiceContext& context,
                                grpc::CallbackServerContext*) {
  auto* reactor = new EchoReactor(context);
  const absl::Status admitted = context.admission->Enter();
  reactor->admitted_ = admitted.ok();
  absl::MutexLock lock(&reactor->mu_);
  if (!admitted.ok()) {
    reactor->Fail(admitted);
  } else {
    reactor->reading_ = true;
    reactor->StartRead(&reactor->incoming_);
  }
  return reactor;
}

EchoReactor::~EchoReactor() {
  if (admitted_) context_.admission->Leave();
}

void EchoReactor::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  reading_ = false;
  if (finishing_) return;
  if (!ok) {
    reads_done_ = true;
  } else {
    const int64_t bytes = incoming_.reply_bytes();
    if (bytes < 0 || bytes > context_.options->max_message_bytes) {
      Fail(absl::InvalidArgumentError(absl::StrCat(
          "reply_bytes: must be in [0, ", context_.options->max_message_bytes,
          "], got ", bytes)));
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
  if (writing_ == nullptr && !writes_.empty()) {
    writing_ = std::move(writes_.front());
    writes_.pop_front();
    StartWrite(writing_.get());
  }
  const int in_flight =
      static_cast<int>(writes_.size()) + (writing_ != nullptr ? 1 : 0);
  if (!reading_ && !reads_done_ && in_flight < kMaxInFlight) {
    reading_ = true;
    StartRead(&incoming_);
  }
  if (reads_done_ && writing_ == nullptr && writes_.empty()) {
    finishing_ = true;
    Finish(grpc::Status::OK);
  }
}

void EchoReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_.reset();
  if (deferred_finish_) {
    Finish(*deferred_finish_);
    deferred_finish_.reset();
    return;
  }
  if (finishing_) return;
  if (!ok) {
    Fail(absl::CancelledError("Echo: the client went away"));
    return;
  }
  Advance();
}

void EchoReactor::Fail(const absl::Status& status) {
  if (finishing_) return;
  finishing_ = true;
  writes_.clear();
  if (writing_ != nullptr) {
    deferred_finish_ = ToGrpcStatus(status);
  } else {
    Finish(ToGrpcStatus(status));
  }
}

void EchoReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  Fail(absl::CancelledError("Echo: cancelled"));
}

void EchoReactor::OnDone() { delete this; }

}  // namespace klserve::server
