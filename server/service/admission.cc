#include "server/service/admission.h"

#include "absl/strings/str_cat.h"
#include "proto/call_metadata.h"

namespace klserve::server {

absl::Status RefuseAtLimit(grpc::CallbackServerContext& call,
                           absl::string_view flag, Metrics& metrics,
                           absl::string_view message) {
  call.AddTrailingMetadata(kOverloadedMetadataKey, std::string(flag));
  metrics.RefusedAtLimit(flag);
  return absl::ResourceExhaustedError(message);
}

absl::Status Admission::Enter(grpc::CallbackServerContext& call) {
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return absl::UnavailableError("server: draining, not taking new requests");
  }
  if (in_flight_ >= max_in_flight_) {
    return RefuseAtLimit(
        call, flag_, *metrics_,
        absl::StrCat("server: ", in_flight_, " ", what_, ", the limit (--",
                     flag_, "); retry later"));
  }
  ++in_flight_;
  metrics_->InFlight(+1);
  return absl::OkStatus();
}

void Admission::Leave() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  metrics_->InFlight(-1);
}

void Admission::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

}  // namespace klserve::server
