// The CPUs the thread pool takes by default: the quota parsing against
// cgroup files' own text, and the count against this machine's affinity.

#include "kernels/cpu/usable_cpus.h"

#include <sched.h>

#include <optional>
#include <thread>

#include "gtest/gtest.h"

namespace klserve::cpu {
namespace {

TEST(CpusOfQuota, CgroupV2CpuMax) {
  EXPECT_EQ(CpusOfQuota("400000 100000\n"), 4);
  EXPECT_EQ(CpusOfQuota("150000 100000\n"), 2);  // 1.5 CPUs: rounded up
  EXPECT_EQ(CpusOfQuota("50000 100000"), 1);
  EXPECT_EQ(CpusOfQuota("max 100000\n"), std::nullopt);
}

TEST(CpusOfQuota, CgroupV1QuotaAndPeriod) {
  EXPECT_EQ(CpusOfQuota("1600000\n 100000\n"), 16);
  EXPECT_EQ(CpusOfQuota("-1\n 100000\n"), std::nullopt);
}

TEST(CpusOfQuota, OtherTextIsNoLimit) {
  for (const char* text : {"", "100000", "a b", "100000 0", "1 2 3"}) {
    EXPECT_EQ(CpusOfQuota(text), std::nullopt) << text;
  }
}

TEST(UsableCpus, AtLeastOneAndAtMostTheAffinity) {
  cpu_set_t affinity;
  ASSERT_EQ(sched_getaffinity(0, sizeof(affinity), &affinity), 0);
  EXPECT_GE(UsableCpus(), 1);
  EXPECT_LE(UsableCpus(), CPU_COUNT(&affinity));
}

}  // namespace
}  // namespace klserve::cpu
