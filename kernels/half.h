#ifndef KLSERVE_KERNELS_HALF_H_
#define KLSERVE_KERNELS_HALF_H_

#include <bit>
#include <cstdint>

// Scalar conversions between float and the 16-bit float formats. Rounding to
// the 16-bit formats is round-to-nearest-even; NaN stays NaN.

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
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}

inline uint16_t FloatToFloat16(float value) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}

}  // namespace klserve

#endif  // KLSERVE_KERNELS_HALF_H_
