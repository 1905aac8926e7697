#include "server/service/unsent_answers.h"

#include "absl/strings/str_cat.h"
#include "server/service/admission.h"

namespace klserve::server {

absl::Status UnsentAnswers::Admit(grpc::CallbackServerContext& call) {
  absl::MutexLock lock(&mu_);
  if (bytes_ < max_bytes_) return absl::OkStatus();
  return RefuseAtLimit(
      call, "max_concurrent_requests", *metrics_,
      absl::StrCat("server: answers of ", bytes_,
                   " bytes wait for their clients to take them, the limit "
                   "(--max_concurrent_requests times --max_message_bytes); "
                   "retry later"));
}

void UnsentAnswers::Add(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_ += bytes;
}

void UnsentAnswers::Remove(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_ -= bytes;
}

}  // namespace klserve::server
