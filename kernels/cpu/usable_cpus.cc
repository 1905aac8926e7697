#include "kernels/cpu/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
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

// The fewest CPUs any cgroup v2 quota on the way from this process's
// cgroup up to the root allows (a limit set on a parent holds for its
// children, "max" on the way included); without one, cgroup v1's.
std::optional<int> CpusOfCgroup() {
  std::optional<int> fewest;
  const auto take = [&](std::optional<int> cpus) {
    if (cpus && (!fewest || *cpus < *fewest)) fewest = cpus;
  };
  if (std::optional<std::string> path = CgroupV2Path()) {
    while (true) {
      if (const std::optional<std::string> max =
              ReadFile("/sys/fs/cgroup" + *path + "/cpu.max")) {
        take(CpusOfQuota(*max));
      }
      const size_t slash = path->find_last_of('/');
      if (slash == std::string::npos || *path == "/") break;
      path->resize(slash == 0 ? 1 : slash);
    }
    if (fewest) return fewest;  // else a hybrid host: the cpu controller on v1
  }
  const std::optional<std::string> quota =
      ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::optional<std::string> period =
      ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (quota && period) take(CpusOfQuota(*quota + " " + *period));
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
