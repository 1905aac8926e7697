#ifndef KLSERVE_SERVER_SHM_REGION_NAMES_H_
#define KLSERVE_SERVER_SHM_REGION_NAMES_H_

// The names a caller gives a shared-memory region: its name in requests and
// the key of the POSIX object behind it. Both are plain names, never paths:
// the key becomes /dev/shm/<key>, so a '/' or a leading '.' could reach
// another file.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace klserve::server {

inline constexpr int kMaxRegionNameBytes = 64;
inline constexpr int kMaxRegionKeyBytes = 255;  // NAME_MAX of /dev/shm

// INVALID_ARGUMENT naming `field` unless `name` is 1 to `max_bytes` of
// A-Z a-z 0-9 . _ - and does not start with '.'.
absl::Status CheckPlainName(absl::string_view field, absl::string_view name,
                            int max_bytes);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SHM_REGION_NAMES_H_
