#include "server/metrics/exact_sum.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "absl/numeric/int128.h"

namespace klserve::server {
namespace {

constexpr int kDigitBits = 32;
// The exponent of the sum's unit: every finite double is a multiple of it.
constexpr int kUnitExponent = -1074;

}  // namespace

void ExactSum::Add(double x) {
  if (std::isnan(x)) {
    nan_ = true;
    return;
  }
  if (std::isinf(x)) {
    (x > 0 ? plus_infinity_ : minus_infinity_) = true;
    return;
  }
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const int biased_exponent = static_cast<int>((bits >> 52) & 0x7ff);
  uint64_t significand = bits & ((uint64_t{1} << 52) - 1);
  if (biased_exponent != 0) significand |= uint64_t{1} << 52;
  if (significand == 0) return;
  // x = significand * 2^(position + kUnitExponent); subnormals share the
  // smallest normal exponent's unit.
  const int position = std::max(biased_exponent, 1) - 1;
  const absl::uint128 shifted = absl::uint128(significand)
                                << (position % kDigitBits);
  const int first = position / kDigitBits;
  const bool negative = (bits >> 63) != 0;
  for (int i = 0; i < 3; ++i) {
    const auto digit = static_cast<int64_t>(
        absl::Uint128Low64(shifted >> (kDigitBits * i)) & 0xffffffffu);
    digits_[first + i] += negative ? -digit : digit;
  }
  if (++terms_since_normalize_ == kTermsPerNormalize) {
    Normalize(digits_);
    terms_since_normalize_ = 0;
  }
}

void ExactSum::Normalize(Digits& digits) {
  for (int i = 0; i + 1 < kDigits; ++i) {
    // An arithmetic shift: the floor, so the word left is in [0, 2^32).
    const int64_t carry = digits[i] >> kDigitBits;
    digits[i] -= carry * (int64_t{1} << kDigitBits);
    digits[i + 1] += carry;
  }
}

double ExactSum::Value() const {
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  if (nan_ || (plus_infinity_ && minus_infinity_)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (plus_infinity_) return kInfinity;
  if (minus_infinity_) return -kInfinity;

  Digits digits = digits_;
  Normalize(digits);
  const bool negative = digits[kDigits - 1] < 0;
  if (negative) {
    for (int64_t& digit : digits) digit = -digit;
    Normalize(digits);
  }
  int top = kDigits - 1;
  while (top >= 0 && digits[top] == 0) --top;
  if (top < 0) return 0.0;

  const auto bit = [&digits](int i) {
    return static_cast<uint64_t>(digits[i / kDigitBits] >> (i % kDigitBits)) &
           1;
  };
  const int highest =
      kDigitBits * top +
      static_cast<int>(std::bit_width(static_cast<uint64_t>(digits[top]))) - 1;
  // The 53 bits from the highest down, rounded to nearest, ties to even, on
  // the bit below them and whether anything below that is set.
  const int lowest = std::max(highest - 52, 0);
  uint64_t significand = 0;
  for (int i = highest; i >= lowest; --i)
    significand = significand << 1 | bit(i);
  if (lowest > 0 && bit(lowest - 1) != 0) {
    const int below = lowest - 1;
    bool sticky = false;
    for (int w = 0; w < below / kDigitBits && !sticky; ++w) {
      sticky = digits[w] != 0;
    }
    if (!sticky && below % kDigitBits != 0) {
      sticky = (digits[below / kDigitBits] &
                ((int64_t{1} << (below % kDigitBits)) - 1)) != 0;
    }
    if (sticky || (significand & 1) != 0) ++significand;
  }
  // Exact (a carry out of the rounding gives 2^53, still exact), or
  // infinity past the largest double, as the rounding asks.
  const double magnitude =
      std::ldexp(static_cast<double>(significand), lowest + kUnitExponent);
  return negative ? -magnitude : magnitude;
}

}  // namespace klserve::server
