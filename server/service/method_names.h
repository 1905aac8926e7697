#ifndef KLSERVE_SERVER_SERVICE_METHOD_NAMES_H_
#define KLSERVE_SERVER_SERVICE_METHOD_NAMES_H_

#include "absl/strings/string_view.h"

namespace klserve::server {

// The IndexerKl service's gRPC path prefix and its methods, as the request
// metrics label them. Nothing else becomes a method label, so a caller
// cannot add series by calling made-up methods.
inline constexpr absl::string_view kIndexerKlPrefix = "/klserve.v1.IndexerKl/";
inline constexpr absl::string_view kIndexerKlMethods[] = {
    "ComputeLoss", "ComputeLossStream", "GetServerInfo",    "FinishStep",
    "Echo",        "RegisterRegion",    "UnregisterRegion", "ListRegions"};

// The methods whose messages carry tensors: the calls that leave the
// allocator large buffers to keep or give back (IdleMemoryRelease).
constexpr bool MovesTensors(absl::string_view method) {
  return method == "ComputeLoss" || method == "ComputeLossStream" ||
         method == "Echo";
}

// True for one of kIndexerKlMethods.
constexpr bool IsIndexerKlMethod(absl::string_view method) {
  for (absl::string_view known : kIndexerKlMethods) {
    if (method == known) return true;
  }
  return false;
}

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_METHOD_NAMES_H_
