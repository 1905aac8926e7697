#ifndef KLSERVE_KERNELS_CPU_VARIANT_LOG_DOUBLE_H_
#define KLSERVE_KERNELS_CPU_VARIANT_LOG_DOUBLE_H_

// log of a double from + - * / alone, for the per-row logarithms (log Z,
// log L). Not std::log: glibc picks its log at run time by CPU (an FMA
// version where there is FMA), so the same binary could give other bits on
// another replica. With -ffp-contract=off these operations round alike on
// every x86-64 CPU and in every variant. Error below 1 ulp.

#include <bit>
#include <cstdint>

#include "kernels/cpu/variant/isa_namespace.h"

namespace klserve::cpu::KLSERVE_ISA {

// x finite and > 0, subnormals included.
inline double LogDouble(double x) {
  int64_t exponent = 0;
  uint64_t bits = std::bit_cast<uint64_t>(x);
  if (bits < 0x0010000000000000u) {  // subnormal: scale by 2^54 first
    bits = std::bit_cast<uint64_t>(x * 0x1p54);
    exponent = -54;
  }
  exponent += static_cast<int64_t>(bits >> 52) - 1023;
  // x = 2^exponent * m with m in [sqrt(1/2), sqrt(2)).
  uint64_t m_bits = (bits & 0x000fffffffffffffu) | 0x3ff0000000000000u;
  if (m_bits > 0x3ff6a09e667f3bcdu) {  // m > sqrt(2): halve it
    m_bits -= uint64_t{1} << 52;
    ++exponent;
  }
  const double f = std::bit_cast<double>(m_bits) - 1.0;  // exact
  // log(1 + f) = 2 atanh(s), s = f / (2 + f), |s| <= 0.1716:
  // 2s + s R with R = sum_k 2 s^(2k) / (2k + 1). Since 2s = f - s f, that is
  // f - h + s (h + R) with h = f^2 / 2: the large terms f and h come first
  // and nearly exact, the rounding of s (h + R) is small beside them.
  const double s = f / (2.0 + f);
  const double z = s * s;
  double r = 2.0 / 23;
  for (double k = 21; k >= 3; k -= 2) r = r * z + 2.0 / k;
  r = r * z;
  const double h = 0.5 * f * f;
  // ln 2 split so that e * kLn2High is exact (|e| < 2^11); the small terms
  // are gathered before they meet the large ones.
  constexpr double kLn2High = 0x1.62e42feep-1;
  constexpr double kLn2Low = 0x1.a39ef35793c76p-33;
  const double e = static_cast<double>(exponent);
  return e * kLn2High - ((h - (s * (h + r) + e * kLn2Low)) - f);
}

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_LOG_DOUBLE_H_
