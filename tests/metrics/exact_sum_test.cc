// ExactSum against sums known exactly: random terms on a fixed-point grid
// summed in 128-bit integers (and rounded once by the conversion to double),
// cancellations a running sum gets wrong, rounding ties, subnormals,
// overflow, and the non-finite rules; in every order of the terms.

#include "server/metrics/exact_sum.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace klserve::server {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMax = std::numeric_limits<double>::max();
constexpr double kDenormMin = std::numeric_limits<double>::denorm_min();
constexpr double kMinNormal = std::numeric_limits<double>::min();

double SumOf(const std::vector<double>& terms) {
  ExactSum sum;
  for (double x : terms) sum.Add(x);
  return sum.Value();
}

// Compares bits, so that -0, NaN and the last bit are all told apart.
void ExpectSameBits(double got, double want) {
  EXPECT_EQ(std::bit_cast<uint64_t>(got), std::bit_cast<uint64_t>(want))
      << "got " << got << ", want " << want;
}

// The sum of `terms` in their order and in 20 shuffled orders.
void ExpectSumInEveryOrder(std::vector<double> terms, double want) {
  ExpectSameBits(SumOf(terms), want);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::shuffle(terms.begin(), terms.end(), rng);
    ExpectSameBits(SumOf(terms), want);
  }
}

TEST(ExactSum, EmptyIsZero) { ExpectSameBits(ExactSum().Value(), 0.0); }

TEST(ExactSum, RandomTermsMatchA128BitIntegerSum) {
  // Terms that are multiples of 2^-40 below 2^62 in magnitude, so that
  // their sum is exact as an integer count of 2^-40; the compiler's
  // conversion of that 128-bit integer to double rounds once, to nearest
  // even. (absl::int128's conversion does not: it rounds twice, and was 1
  // ulp off here.)
  std::mt19937_64 rng(20261204);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 2000);
    std::vector<double> terms;
    __int128 units = 0;
    for (int i = 0; i < n; ++i) {
      // Magnitudes from 2^-40 to 2^62, so that the rounding matters.
      const int bits = 1 + static_cast<int>(rng() % 53);
      const int shift = static_cast<int>(rng() % 50);
      int64_t count = static_cast<int64_t>(rng() >> (64 - bits)) << shift;
      if (count >= (int64_t{1} << 62)) count >>= 2;
      if (rng() % 2) count = -count;
      const double term = std::ldexp(static_cast<double>(count), -40);
      ASSERT_EQ(std::ldexp(term, 40), static_cast<double>(count));
      terms.push_back(term);
      units += count;
    }
    const double want = std::ldexp(static_cast<double>(units), -40);
    ExpectSumInEveryOrder(terms, want);
  }
}

TEST(ExactSum, KeepsTermsARunningSumLoses) {
  ExpectSumInEveryOrder({1e300, 1.0, -1e300}, 1.0);
  ExpectSumInEveryOrder({1.0, 1e-30, -1.0}, 1e-30);
}

TEST(ExactSum, DecimalsSumToTheirExactBinaryValue) {
  // The doubles nearest 0.1, 0.2 and 0.3 are k * 2^-55 for these k; their
  // exact sum 0.1 + 0.2 - 0.3 is (k1 + k2 - k3) * 2^-55 = 2^-55.
  ASSERT_EQ(std::ldexp(0.1, 55), 3602879701896397.0);
  ASSERT_EQ(std::ldexp(0.2, 55), 7205759403792794.0);
  ASSERT_EQ(std::ldexp(0.3, 55), 10808639105689190.0);
  ExpectSumInEveryOrder({0.1, 0.2, -0.3}, std::ldexp(1.0, -55));
}

TEST(ExactSum, RoundsTiesToEven) {
  const double two53 = std::ldexp(1.0, 53);
  ExpectSumInEveryOrder({two53, 1.0}, two53);              // tie, down to even
  ExpectSumInEveryOrder({two53, 3.0}, two53 + 4.0);        // tie, up to even
  ExpectSumInEveryOrder({two53, 1.0, 1e-9}, two53 + 2.0);  // past the tie
  ExpectSumInEveryOrder({two53, 1.0, -1e-9}, two53);       // short of it
  ExpectSumInEveryOrder({-two53, -3.0}, -(two53 + 4.0));
}

TEST(ExactSum, SubnormalsAreExact) {
  ExpectSumInEveryOrder({kDenormMin, kDenormMin, kDenormMin}, 3 * kDenormMin);
  ExpectSumInEveryOrder({kMinNormal, -kDenormMin},
                        std::nextafter(kMinNormal, 0.0));
  ExpectSumInEveryOrder({kDenormMin, 1.0, -1.0}, kDenormMin);
}

TEST(ExactSum, IntermediateOverflowDoesNotStick) {
  ExpectSumInEveryOrder({kMax, kMax, -kMax}, kMax);
  ExpectSumInEveryOrder({kMax, kMax, -kMax, -kMax}, 0.0);
}

TEST(ExactSum, OverflowRoundsToInfinity) {
  ExpectSumInEveryOrder({kMax, kMax}, kInf);
  ExpectSumInEveryOrder({-kMax, -kMax}, -kInf);
  // Half an ulp above the largest double is a tie; its significand is odd,
  // so it rounds up, past the range.
  ExpectSumInEveryOrder({kMax, std::ldexp(1.0, 970)}, kInf);
  ExpectSumInEveryOrder({kMax, std::ldexp(1.0, 969)}, kMax);
}

TEST(ExactSum, NonFiniteTerms) {
  ExpectSumInEveryOrder({1.0, kInf, kMax}, kInf);
  ExpectSumInEveryOrder({1.0, -kInf}, -kInf);
  EXPECT_TRUE(std::isnan(SumOf({1.0, kInf, -kInf})));
  EXPECT_TRUE(std::isnan(SumOf({1.0, std::nan(""), 2.0})));
  EXPECT_TRUE(std::isnan(SumOf({kInf, std::nan("")})));
}

TEST(ExactSum, ManyTermsOfEveryMagnitude) {
  // x and -x for terms across the whole range, plus a known remainder: a
  // running sum loses the remainder, this keeps it.
  std::mt19937_64 rng(11);
  std::vector<double> terms;
  for (int i = 0; i < 5000; ++i) {
    const double x = std::bit_cast<double>(rng() & ~(uint64_t{1} << 63));
    if (!std::isfinite(x)) continue;
    terms.push_back(x);
    terms.push_back(-x);
  }
  terms.push_back(0.75);
  terms.push_back(kDenormMin);
  ExpectSumInEveryOrder(terms, 0.75);  // 0.75 + 2^-1074 rounds to 0.75
  terms.push_back(-0.75);
  ExpectSumInEveryOrder(terms, kDenormMin);
}

}  // namespace
}  // namespace klserve::server
