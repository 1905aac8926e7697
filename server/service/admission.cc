#include "server/service/admission.h"

#include "absl/strings/str_cat.h"
#include "proto/call_metadata.h"

namespace klserve::server {

absl::Status Admission::Enter(grpc::CallbackServerContext& call) {
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return absl::UnavailableError("server: draining, not taking new requests");
  }
  if (in_flight_ >= max_in_flight_) {
    call.AddTrailingMetadata(kOverloadedMetadataKey, flag_);
    metrics_->RefusedAtLimit(flag_);
    return absl::ResourceExhaustedError(
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
