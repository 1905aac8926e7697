#ifndef KLSERVE_KERNELS_CPU_USABLE_CPUS_H_
#define KLSERVE_KERNELS_CPU_USABLE_CPUS_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace klserve::cpu {

// The CPUs this process may use: the CPUs of its affinity mask, fewer when
// its cgroup's CPU quota allows fewer (a container's CPU limit; the quota
// rounded up). std::thread::hardware_concurrency() counts the host's CPUs:
// a pool that large under a 4-CPU limit is throttled, not faster. At
// least 1.
int UsableCpus();

// The CPUs a cgroup's quota allows, rounded up: from cgroup v2's cpu.max
// ("<quota> <period>", or "max <period>": no limit) or from cgroup v1's
// cpu.cfs_quota_us and cpu.cfs_period_us given as "<quota> <period>"
// (quota -1: no limit). nullopt when there is no limit or the text is not
// one of these.
std::optional<int> CpusOfQuota(absl::string_view quota_and_period);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_USABLE_CPUS_H_
