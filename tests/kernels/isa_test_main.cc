// The main of the kernel suites. `--isa=auto|avx512|avx2|baseline` picks the
// CPU kernels' variant they run under (testdata::TestIsa); CMake registers
// each suite once per variant, so that no variant's path goes untested on a
// machine that runs it. On a CPU that cannot run the variant asked for, no
// test runs, and the line printed makes CTest count the test as skipped.

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/test_data.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const absl::StatusOr<klserve::cpu::Isa> isa =
      klserve::cpu::TakeIsaFlag(argc, argv);
  if (absl::IsFailedPrecondition(isa.status())) {
    std::printf("[  SKIPPED ] %s\n",
                std::string(isa.status().message()).c_str());
    return 0;
  }
  if (!isa.ok()) {
    std::fprintf(stderr, "%s\n", std::string(isa.status().message()).c_str());
    return 2;
  }
  klserve::testdata::SetTestIsa(*isa);
  return RUN_ALL_TESTS();
}
