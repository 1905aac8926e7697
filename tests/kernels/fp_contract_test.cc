// The project compiles C++ with -ffp-contract=off (CMakeLists.txt): a
// multiply and an add written apart are never fused behind the code's back,
// so every inlined copy of an expression rounds alike and results do not
// depend on alignment or optimisation level. This fails if the flag is lost
// on a target with FMA (GNU C++ fuses by default).

#include <cmath>

#include "gtest/gtest.h"

namespace klserve {
namespace {

TEST(FpContract, MultiplyAndAddAreNotFused) {
  // a * b = 1 + 2^-11 + 2^-24 exactly, which float32 rounds (a tie, to
  // even) to 1 + 2^-11; adding c then gives 0. Fused, it gives 2^-24.
  volatile float a = 1.0f + 0x1p-12f;
  volatile float b = 1.0f + 0x1p-12f;
  volatile float c = -(1.0f + 0x1p-11f);
  ASSERT_EQ(std::fma(float{a}, float{b}, float{c}), 0x1p-24f)
      << "the inputs no longer tell fused from unfused";
  EXPECT_EQ(a * b + c, 0.0f) << "a * b + c was fused";
}

}  // namespace
}  // namespace klserve
