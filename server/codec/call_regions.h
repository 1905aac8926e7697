#ifndef KLSERVE_SERVER_CODEC_CALL_REGIONS_H_
#define KLSERVE_SERVER_CODEC_CALL_REGIONS_H_

// The shared-memory regions one ComputeLoss call reads and writes: held
// from the first slice resolved until the call is destroyed, so that no
// region is unmapped while the call computes from it or into it.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "klserve/v1/klserve.pb.h"
#include "server/shm/region_registry.h"

namespace klserve::server {

class CallRegions {
 public:
  // `registry` null: the server serves no regions, and every slice is
  // refused; so is every slice of a caller that is not `local` (on this
  // host), which cannot have made the region and must not read another
  // job's.
  // Copies (Copy) are bounded by `max_copy_bytes` each (--max_tensor_bytes).
  explicit CallRegions(RegionRegistry* registry, bool local = true,
                       int64_t max_copy_bytes = INT64_MAX)
      : registry_(registry), local_(local), max_copy_bytes_(max_copy_bytes) {}

  // The bytes `slice` names, for a tensor of `element_size`-byte elements
  // that `field` ("indexer_scores.region", "outputs.grad") holds: within
  // the region, starting at a multiple of the element size, and, for an
  // output, overlapping no other slice of the call. Errors name `field`.
  absl::StatusOr<std::byte*> Input(absl::string_view field,
                                   const v1::RegionSlice& slice,
                                   int64_t element_size);
  absl::StatusOr<std::byte*> Output(absl::string_view field,
                                    const v1::RegionSlice& slice,
                                    int64_t element_size);

  // A copy of `bytes` bytes at `data`, owned by the call: for tensors whose
  // values steer indexing, which must not change after they are checked.
  // RESOURCE_EXHAUSTED naming `field` past max_copy_bytes.
  absl::StatusOr<const std::byte*> Copy(absl::string_view field,
                                        const std::byte* data, int64_t bytes);

  bool empty() const { return held_.empty(); }
  // The first region's name, for messages.
  const std::string& first_name() const { return held_.front().name(); }

  // After computing: FAILED_PRECONDITION when a region's object shrank
  // under the call (MappedRegion::CheckIntact).
  absl::Status CheckIntact() const;

 private:
  struct Span {
    std::string field;
    const RegionUse* region;
    int64_t begin, end;
  };
  absl::StatusOr<std::byte*> Resolve(absl::string_view field,
                                     const v1::RegionSlice& slice,
                                     int64_t element_size, bool output);

  RegionRegistry* registry_;
  bool local_;
  int64_t max_copy_bytes_;
  std::deque<RegionUse> held_;  // one per region named; never moved
  std::vector<Span> spans_;
  std::vector<std::unique_ptr<std::byte[]>> copies_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_CODEC_CALL_REGIONS_H_
