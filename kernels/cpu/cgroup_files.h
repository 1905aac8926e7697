#ifndef KLSERVE_KERNELS_CPU_CGROUP_FILES_H_
#define KLSERVE_KERNELS_CPU_CGROUP_FILES_H_

// Where the kernel states this process's cgroup limits (a container's CPU
// and memory limits), for UsableCpus and UsableMemoryBytes.

#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace klserve::cpu {

// Calls visit(dir) with each cgroup directory from this process's own up to
// its hierarchy's root, nearest first: a limit set on a parent holds for
// its children. cgroup v2's hierarchy when `v1_controller` is empty, else
// that cgroup v1 controller's ("cpu", "memory"), mounted under
// /sys/fs/cgroup/<controller>. Visits nothing where the hierarchy is not
// there.
void ForEachCgroupDir(absl::string_view v1_controller,
                      absl::FunctionRef<void(const std::string& dir)> visit);

// The text of a file, nullopt when it cannot be read.
std::optional<std::string> ReadCgroupFile(const std::string& path);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_CGROUP_FILES_H_
