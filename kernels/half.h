#ifndef KLSERVE_KERNELS_HALF_H_
#define KLSERVE_KERNELS_HALF_H_

#include <bit>
#include <cstdint>

// Scalar conversions between float and the 16-bit float formats, in integer
// arithmetic, so that they compile for every target with GCC and clang (clang
// 14 accepts _Float16 on x86 only with AVX512-FP16). Rounding to the 16-bit
// formats is round-to-nearest-even; subnormals are exact both ways; NaN stays
// NaN, made quiet, its sign and leading payload bits kept. FP16 gives the
// same bits as the F16C instructions (vcvtps2ph with round-to-nearest,
// vcvtph2ps) for every input, so vector code may use either.

namespace klserve {

inline float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet, keep sign
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf, or NaN made quiet
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) |
                                (mantissa != 0 ? 0x00400000u : 0u));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact
    return std::bit_cast<float>(
        sign |
        std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f));
  }
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

inline uint16_t FloatToFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, top 9 payload bits kept
    return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  }
  // From 65520 (halfway between the largest half, 65504, and 2^16) up.
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude >= 0x38800000u) {  // a normal half, 2^-14 and up
    // Rebias from 127 to 15, then round away the 13 low mantissa bits to
    // nearest even; a carry correctly bumps the exponent.
    const uint32_t rebiased = magnitude - 0x38000000u;
    return sign | static_cast<uint16_t>(
                      (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13);
  }
  // At most 2^-25, halfway to the smallest subnormal: rounds to (even) zero.
  if (magnitude <= 0x33000000u) return sign;
  // A subnormal half: the float's 24-bit significand in units of 2^-24,
  // shifted right by 14 to 24 bits and rounded to nearest even (a carry into
  // bit 10 gives the smallest normal, as it should).
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - (magnitude >> 23);
  const uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const bool up = rest > half || (rest == half && (kept & 1u) != 0);
  return sign | static_cast<uint16_t>(kept + (up ? 1u : 0u));
}

}  // namespace klserve

#endif  // KLSERVE_KERNELS_HALF_H_
