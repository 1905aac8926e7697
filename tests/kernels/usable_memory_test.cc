// The memory klctl bench bounds its problems by: the limit parsing against
// cgroup files' own text, and the figure against this machine's memory and
// this process's own cgroup v2 limit, found here without the walk.

#include "kernels/cpu/usable_memory.h"

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/cgroup_files.h"

namespace klserve::cpu {
namespace {

TEST(BytesOfMemoryLimit, CgroupV2MemoryMax) {
  EXPECT_EQ(BytesOfMemoryLimit("2147483648\n"), int64_t{2147483648});
  EXPECT_EQ(BytesOfMemoryLimit("max\n"), std::nullopt);
}

TEST(BytesOfMemoryLimit, CgroupV1LimitInBytes) {
  EXPECT_EQ(BytesOfMemoryLimit("536870912\n"), int64_t{536870912});
  // v1's "no limit": a page-rounded 2^63 - 1, above any machine's memory.
  EXPECT_EQ(BytesOfMemoryLimit("9223372036854771712\n"),
            int64_t{9223372036854771712});
}

TEST(BytesOfMemoryLimit, OtherTextIsNoLimit) {
  for (const char* text :
       {"", "\n", "-1", "0", "1 2", "12k", "max 1", "99999999999999999999"}) {
    EXPECT_EQ(BytesOfMemoryLimit(text), std::nullopt) << text;
  }
}

TEST(UsableMemoryBytes, PositiveAndWithinTheMachineAndOwnCgroupLimit) {
  const std::optional<int64_t> usable = UsableMemoryBytes();
  ASSERT_TRUE(usable.has_value());
  EXPECT_GT(*usable, 0);
  const int64_t machine = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
  EXPECT_LE(*usable, machine);
  // This process's own cgroup v2 limit, where it has one.
  const std::optional<std::string> cgroups =
      ReadCgroupFile("/proc/self/cgroup");
  ASSERT_TRUE(cgroups.has_value());
  const size_t v2 = cgroups->find("0::/");
  if (v2 == std::string::npos) return;
  const size_t end = cgroups->find('\n', v2);
  const std::string path = cgroups->substr(v2 + 3, end - v2 - 3);
  const std::optional<std::string> max =
      ReadCgroupFile("/sys/fs/cgroup" + path + "/memory.max");
  if (max && *max != "max\n") {
    EXPECT_LE(*usable, std::stoll(*max)) << path;
  }
}

}  // namespace
}  // namespace klserve::cpu
