#include "kernels/cpu/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace klserve::cpu {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// This process's cgroup v2 path ("0::<path>" in /proc/self/cgroup).
std::optional<std::string> CgroupV2Path() {
  const std::optional<std::string> cgroups = ReadFile("/proc/self/cgroup");
  if (!cgroups) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n')) {
    if (absl::ConsumePrefix(&line, "0::")) return std::string(line);
  }
  return std::nullopt;
}

// The quota's CPUs: cgroup v2 at this process's own cgroup, then at the
// root of the cgroup namespace (what a container sees), then cgroup v1.
std::optional<int> CpusOfCgroup() {
  if (const std::optional<std::string> path = CgroupV2Path()) {
    if (const std::optional<std::string> max =
            ReadFile("/sys/fs/cgroup" + *path + "/cpu.max")) {
      return CpusOfQuota(*max);
    }
  }
  if (const std::optional<std::string> max =
          ReadFile("/sys/fs/cgroup/cpu.max")) {
    return CpusOfQuota(*max);
  }
  const std::optional<std::string> quota =
      ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::optional<std::string> period =
      ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (quota && period) return CpusOfQuota(*quota + " " + *period);
  return std::nullopt;
}

}  // namespace

std::optional<int> CpusOfQuota(absl::string_view quota_and_period) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(quota_and_period),
                     absl::ByAnyChar(" \n\t"), absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period) || quota <= 0 || period <= 0) {
    return std::nullopt;  // "max", -1, or not a quota at all
  }
  const int64_t cpus = (quota + period - 1) / period;
  return static_cast<int>(std::min<int64_t>(cpus, 1 << 20));
}

int UsableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t affinity;
  if (sched_getaffinity(0, sizeof(affinity), &affinity) == 0) {
    cpus = CPU_COUNT(&affinity);
  }
  if (const std::optional<int> quota = CpusOfCgroup()) {
    cpus = std::min(cpus, *quota);
  }
  return std::max(cpus, 1);
}

}  // namespace klserve::cpu
