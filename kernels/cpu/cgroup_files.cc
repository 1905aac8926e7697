#include "kernels/cpu/cgroup_files.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace klserve::cpu {
namespace {

// This process's path in one hierarchy, from /proc/self/cgroup's lines
// "<id>:<controllers>:<path>": cgroup v2's has id 0 and no controllers.
std::optional<std::string> CgroupPath(absl::string_view v1_controller) {
  const std::optional<std::string> cgroups =
      ReadCgroupFile("/proc/self/cgroup");
  if (!cgroups) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n')) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (v1_controller.empty()) {
      if (fields[0] == "0" && fields[1].empty()) return std::string(fields[2]);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == v1_controller) return std::string(fields[2]);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> ReadCgroupFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void ForEachCgroupDir(absl::string_view v1_controller,
                      absl::FunctionRef<void(const std::string& dir)> visit) {
  std::optional<std::string> path = CgroupPath(v1_controller);
  if (!path || path->empty() || path->front() != '/') return;
  const std::string mount =
      v1_controller.empty() ? "/sys/fs/cgroup"
                            : absl::StrCat("/sys/fs/cgroup/", v1_controller);
  while (true) {
    visit(*path == "/" ? mount : mount + *path);
    if (*path == "/") break;
    const size_t slash = path->find_last_of('/');
    path->resize(slash == 0 ? 1 : slash);
  }
}

}  // namespace klserve::cpu
