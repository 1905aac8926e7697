#ifndef KLSERVE_KERNELS_CPU_USABLE_MEMORY_H_
#define KLSERVE_KERNELS_CPU_USABLE_MEMORY_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace klserve::cpu {

// The memory this process may use: the machine's physical memory, less when
// a cgroup memory limit is lower (a container's memory limit, the lowest on
// the way from this process's cgroup up to the root). A process that counts
// only the machine's memory is killed by the kernel at its container's
// limit instead of refusing in time. nullopt when the machine does not say.
std::optional<int64_t> UsableMemoryBytes();

// The bytes of a cgroup memory limit: cgroup v2's memory.max ("max": no
// limit) or cgroup v1's memory.limit_in_bytes (no limit reads as a number
// near 2^63, above any machine's memory, so taking it changes nothing).
// nullopt when there is no limit or the text is not one.
std::optional<int64_t> BytesOfMemoryLimit(absl::string_view text);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_USABLE_MEMORY_H_
