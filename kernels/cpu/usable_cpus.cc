#include "kernels/cpu/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/cgroup_files.h"

namespace klserve::cpu {
namespace {

// The fewest CPUs any cgroup CPU quota on the way from this process's
// cgroup up to the root allows ("max" on the way included): cgroup v2's,
// else (none, or a hybrid host with the cpu controller on v1) v1's.
std::optional<int> CpusOfCgroup() {
  std::optional<int> fewest;
  const auto take = [&](std::optional<int> cpus) {
    if (cpus && (!fewest || *cpus < *fewest)) fewest = cpus;
  };
  ForEachCgroupDir("", [&](const std::string& dir) {
    if (const std::optional<std::string> max =
            ReadCgroupFile(dir + "/cpu.max")) {
      take(CpusOfQuota(*max));
    }
  });
  if (fewest) return fewest;
  ForEachCgroupDir("cpu", [&](const std::string& dir) {
    const std::optional<std::string> quota =
        ReadCgroupFile(dir + "/cpu.cfs_quota_us");
    const std::optional<std::string> period =
        ReadCgroupFile(dir + "/cpu.cfs_period_us");
    if (quota && period) take(CpusOfQuota(*quota + " " + *period));
  });
  return fewest;
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
