#ifndef KLSERVE_SERVER_STREAM_REACTOR_BASE_H_
#define KLSERVE_SERVER_STREAM_REACTOR_BASE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/grpc_status.h"
#include "server/service_context.h"

namespace klserve::server {

// What the bidirectional RPCs share: an admission slot held for the call's
// life, one read and one write in flight at most, a queue of responses, and
// one way to end the call on error (Finish waits for the write in flight).
// Derived reactors react to reads and decide what to write; they call Begin
// from their factory. All state is guarded by mu_; gRPC may call the
// reactions on any of its threads.
template <typename Request, typename Response>
class StreamReactorBase : public grpc::ServerBidiReactor<Request, Response> {
 public:
  void OnWriteDone(bool ok) final {
    absl::MutexLock lock(&mu_);
    writing_.reset();
    if (deferred_finish_) {
      this->Finish(*deferred_finish_);
      deferred_finish_.reset();
      return;
    }
    if (finishing_) return;
    if (!ok) {
      Fail(absl::CancelledError(absl::StrCat(rpc_, ": the client went away")));
      return;
    }
    OnWritten();
  }

  void OnCancel() final {
    absl::MutexLock lock(&mu_);
    Fail(absl::CancelledError(
        absl::StrCat(rpc_, ": cancelled by the client or its deadline")));
  }

 protected:
  StreamReactorBase(const ServiceContext& context, const char* rpc)
      : context_(context), rpc_(rpc) {}
  ~StreamReactorBase() override {
    LeaveAdmission();
    context_.metrics->RecordRequest(rpc_, absl::StatusCodeToString(code_),
                                    absl::ToDoubleSeconds(absl::Now() - start_),
                                    bytes_in_, bytes_out_, rows_);
  }

  // Takes an admission slot and starts reading, or ends the call with the
  // refusal (RESOURCE_EXHAUSTED, or UNAVAILABLE while draining).
  void Begin() {
    const absl::Status admitted = context_.admission->Enter();
    admitted_ = admitted.ok();
    absl::MutexLock lock(&mu_);
    if (!admitted.ok()) {
      Fail(admitted);
    } else {
      reading_ = true;
      this->StartRead(&incoming_);
    }
  }

  // After a write completed and the call goes on.
  virtual void OnWritten() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // Starts writing the next queued response unless one is in flight.
  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ != nullptr || writes_.empty()) return;
    writing_ = std::move(writes_.front());
    writes_.pop_front();
    bytes_out_ += static_cast<int64_t>(writing_->ByteSizeLong());
    this->StartWrite(writing_.get());
  }

  // Starts reading the next message if reads are still open and fewer than
  // `limit` messages are held.
  void ReadNext(int held, int limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || reads_done_ || held >= limit) return;
    reading_ = true;
    this->StartRead(&incoming_);
  }

  int WritesHeld() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(writes_.size()) + (writing_ != nullptr ? 1 : 0);
  }

  // Ends the call with `status`, once; nothing more is read or written.
  void Fail(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    code_ = status.code();
    LeaveAdmission();
    writes_.clear();
    if (writing_ != nullptr) {
      deferred_finish_ = ToGrpcStatus(status);
    } else {
      this->Finish(ToGrpcStatus(status));
    }
  }

  // Ends the call successfully; no write may be in flight.
  void FinishOk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finishing_ = true;
    code_ = absl::StatusCode::kOk;
    LeaveAdmission();
    this->Finish(grpc::Status::OK);
  }

  // The slot goes back when the call is finished, before gRPC has sent the
  // status, so that a client's next call never finds it still taken.
  void LeaveAdmission() {
    if (admitted_.exchange(false)) context_.admission->Leave();
  }

  const ServiceContext context_;
  const char* const rpc_;  // the RPC's name, for messages
  std::atomic<bool> admitted_ = false;
  absl::Mutex mu_;
  Request incoming_ ABSL_GUARDED_BY(mu_);  // the read in flight
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;  // the client half-closed
  std::deque<std::unique_ptr<Response>> writes_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Response> writing_ ABSL_GUARDED_BY(mu_);
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  // For the request metrics, recorded when the reactor goes.
  const absl::Time start_ = absl::Now();
  int64_t bytes_in_ = 0;
  int64_t bytes_out_ = 0;
  int64_t rows_ = 0;
  absl::StatusCode code_ = absl::StatusCode::kUnknown;

 private:
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_STREAM_REACTOR_BASE_H_
