// The main of the kernel suites. `--isa=auto|avx512|avx2|baseline` picks the
// CPU kernels' variant they run under (testdata::TestIsa); CMake registers
// each suite once per variant, so that no variant's path goes untested on a
// machine that runs it. On a CPU that cannot run the variant asked for,
// every test is skipped.

#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "tests/kernels/test_data.h"

namespace {

class SkipEverything : public testing::Environment {
 public:
  explicit SkipEverything(std::string why) : why_(std::move(why)) {}
  void SetUp() override { GTEST_SKIP() << why_; }

 private:
  std::string why_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const absl::StatusOr<klserve::cpu::Isa> isa =
      klserve::cpu::TakeIsaFlag(argc, argv);
  if (isa.ok()) {
    klserve::testdata::SetTestIsa(*isa);
  } else if (absl::IsFailedPrecondition(isa.status())) {
    testing::AddGlobalTestEnvironment(
        new SkipEverything(std::string(isa.status().message())));
  } else {
    std::fprintf(stderr, "%s\n", std::string(isa.status().message()).c_str());
    return 2;
  }
  return RUN_ALL_TESTS();
}
