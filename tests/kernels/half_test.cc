// kernels/half.h against the float64 reference's codecs and against the F16C
// instructions: every one of the 65,536 patterns of each 16-bit format both
// ways, the rounding boundaries between every pair of neighbours, and a
// sweep of float inputs.

#include "kernels/half.h"

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klserve {
namespace {

bool IsNaN16(uint16_t h, int exponent_bits) {
  const int mantissa_bits = 15 - exponent_bits;
  const uint16_t exponent_mask =
      static_cast<uint16_t>(((1u << exponent_bits) - 1) << mantissa_bits);
  return (h & exponent_mask) == exponent_mask &&
         (h & ((1u << mantissa_bits) - 1)) != 0;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(Half, EveryFloat16PatternWidensExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Float16ToFloat(static_cast<uint16_t>(h));
    if (IsNaN16(static_cast<uint16_t>(h), 5)) {
      // Quiet, with the sign and the payload moved to the top.
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(Bits(f),
                ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13))
          << std::hex << h;
      continue;
    }
    const double want = klref::DecodeFloat16(static_cast<uint16_t>(h));
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
  }
}

TEST(Half, EveryFloat16PatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back =
        FloatToFloat16(Float16ToFloat(static_cast<uint16_t>(h)));
    const uint16_t want = IsNaN16(static_cast<uint16_t>(h), 5)
                              ? static_cast<uint16_t>(h | 0x200u)
                              : static_cast<uint16_t>(h);
    ASSERT_EQ(back, want) << std::hex << h;
  }
}

// Between each pair of neighbouring finite halves of one sign: the midpoint
// goes to the even one, the floats just beside it to the nearer one, all as
// the reference rounds the same value.
TEST(Half, Float16RoundsToNearestEvenAtEveryBoundary) {
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t m = 0; m < 0x7c00u; ++m) {
      const uint16_t lo = static_cast<uint16_t>(sign | m);
      const uint16_t hi = static_cast<uint16_t>(sign | (m + 1));
      const double a = klref::DecodeFloat16(lo);
      // Past the largest half, the next step of its binade would be 2^16.
      const double b = (hi & 0x7fffu) == 0x7c00u ? std::copysign(65536.0, a)
                                                 : klref::DecodeFloat16(hi);
      const float mid = static_cast<float>((a + b) / 2);  // exact in float
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
      const uint16_t even = (m & 1u) == 0 ? lo : hi;
      ASSERT_EQ(FloatToFloat16(mid), even) << std::hex << m;
      const float below = std::nextafter(mid, 0.0f);
      const float above = std::nextafter(mid, 2 * mid);
      ASSERT_EQ(FloatToFloat16(below), lo) << std::hex << m;
      ASSERT_EQ(FloatToFloat16(above), hi) << std::hex << m;
      for (float f : {mid, below, above}) {
        ASSERT_EQ(FloatToFloat16(f), klref::EncodeFloat16(f)) << f;
      }
    }
  }
}

TEST(Half, Float16Extremes) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFloat16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // the tie goes to inf
  EXPECT_EQ(FloatToFloat16(-1e30f), 0xfc00);
  EXPECT_EQ(FloatToFloat16(inf), 0x7c00);
  EXPECT_EQ(FloatToFloat16(-inf), 0xfc00);
  EXPECT_EQ(FloatToFloat16(0x1p-25f), 0x0000);  // the tie goes to 0
  EXPECT_EQ(FloatToFloat16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFloat16(-0x1p-24f), 0x8001);
  EXPECT_EQ(FloatToFloat16(0x1p-149f), 0x0000);
  EXPECT_EQ(FloatToFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFloat16(std::bit_cast<float>(0x7f800001u)), 0x7e00);
  EXPECT_EQ(FloatToFloat16(std::bit_cast<float>(0xffc02000u)), 0xfe01);
}

TEST(Half, EveryBFloat16PatternBothWays) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = BFloat16ToFloat(b);
    if (IsNaN16(b, 8)) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_EQ(FloatToBFloat16(f), b | 0x40u) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), klref::DecodeBFloat16(b))
        << std::hex << h;
    ASSERT_EQ(FloatToBFloat16(f), b) << std::hex << h;
  }
}

// The F16C instructions, where this CPU has them, give the same bits as the
// portable conversions: every half, and floats across the whole range.
__attribute__((target("f16c"))) uint16_t HardwareToHalf(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(
      _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float HardwareFromHalf(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(h))));
}

TEST(Half, PortableMatchesF16c) {
  // The AVX2 variant's CPUs have F16C (kernels/cpu/isa.cc checks it).
  if (!cpu::CpuRuns(cpu::Isa::kAvx2)) GTEST_SKIP() << "this CPU has no F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    ASSERT_EQ(Bits(HardwareFromHalf(b)), Bits(Float16ToFloat(b)))
        << std::hex << h;
  }
  // Every 251st float bit pattern (all signs, exponents, NaN payloads), and
  // every float within 4 ulps of each half's midpoint with its neighbour.
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += 251) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(i));
    ASSERT_EQ(HardwareToHalf(f), FloatToFloat16(f)) << std::hex << i;
  }
  for (uint32_t m = 0; m < 0x7c00u; ++m) {
    const double mid = (klref::DecodeFloat16(static_cast<uint16_t>(m)) +
                        klref::DecodeFloat16(static_cast<uint16_t>(m + 1))) /
                       2;
    const uint32_t center = Bits(static_cast<float>(mid));
    for (uint32_t bits = center - 4; bits <= center + 4; ++bits) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float f = std::bit_cast<float>(bits | sign);
        ASSERT_EQ(HardwareToHalf(f), FloatToFloat16(f)) << std::hex << bits;
      }
    }
  }
}

}  // namespace
}  // namespace klserve
