#include "kernels/cpu/variant/row_convert.h"

#include <immintrin.h>

#include <bit>
#include <cstring>

#include "kernels/cpu/variant/wide.h"
#include "kernels/half.h"

namespace klserve::cpu::KLSERVE_ISA {

namespace {

// Conversions run register by register: each element converts alone, so the
// bits do not depend on the register width.
constexpr int kRegLanes = kRegisterBytes / 4;
using RegH = uint16_t __attribute__((vector_size(kRegisterBytes / 2)));

RegF WidenBFloat16(RegH h) {
  return std::bit_cast<RegF>(__builtin_convertvector(h, RegU) << 16);
}

// FloatToBFloat16 (kernels/half.h), lane by lane.
RegH NarrowBFloat16(RegF v) {
  const RegU bits = std::bit_cast<RegU>(v);
  const RegI nan = std::bit_cast<RegI>(bits & 0x7fffffffu) > 0x7f800000;
  const RegU rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const RegU quiet = (bits >> 16) | 0x40u;
  return __builtin_convertvector(nan ? quiet : rounded, RegH);
}

// F16C converts exactly as kernels/half.h does (every input was compared);
// the baseline has no F16C and converts lane by lane. (The maskz forms: the
// unmasked AVX-512 intrinsics start from an undefined register, which GCC 12
// warns about.)
RegF WidenFloat16(RegH h) {
#if defined(__AVX512F__)
  return _mm512_maskz_cvtph_ps(0xffff, std::bit_cast<__m256i>(h));
#elif defined(__F16C__)
  return _mm256_cvtph_ps(std::bit_cast<__m128i>(h));
#else
  RegF v;
  for (int l = 0; l < kRegLanes; ++l) v[l] = Float16ToFloat(h[l]);
  return v;
#endif
}

RegH NarrowFloat16(RegF v) {
#if defined(__AVX512F__)
  return std::bit_cast<RegH>(_mm512_maskz_cvtps_ph(
      0xffff, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  return std::bit_cast<RegH>(
      _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  RegH h;
  for (int l = 0; l < kRegLanes; ++l) h[l] = FloatToFloat16(v[l]);
  return h;
#endif
}

// n 16-bit floats at `data` (any alignment) as floats: whole vectors, then
// the scalar conversion that gives the same bits for the tail.
template <RegF (*kWiden)(RegH), float (*kToFloat)(uint16_t)>
void WidenRow(const std::byte* data, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kRegLanes <= n; i += kRegLanes) {
    RegH h;
    std::memcpy(&h, data + 2 * i, sizeof h);
    const RegF v = kWiden(h);
    std::memcpy(out + i, &v, sizeof v);
  }
  for (; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + 2 * i, 2);
    out[i] = kToFloat(bits);
  }
}

// n floats as 16-bit floats at `dst` (any alignment).
template <RegH (*kNarrow)(RegF), uint16_t (*kFromFloat)(float)>
void NarrowRow(const float* src, int64_t n, std::byte* dst) {
  int64_t i = 0;
  for (; i + kRegLanes <= n; i += kRegLanes) {
    RegF v;
    std::memcpy(&v, src + i, sizeof v);
    const RegH h = kNarrow(v);
    std::memcpy(dst + 2 * i, &h, sizeof h);
  }
  for (; i < n; ++i) {
    const uint16_t bits = kFromFloat(src[i]);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

}  // namespace

const float* FloatRow(DType dtype, const std::byte* data, int64_t n,
                      float* scratch) {
  if (IsDirectFloat(dtype, data)) return reinterpret_cast<const float*>(data);
  switch (dtype) {
    case DType::kBFloat16:
      WidenRow<WidenBFloat16, BFloat16ToFloat>(data, n, scratch);
      break;
    case DType::kFloat16:
      WidenRow<WidenFloat16, Float16ToFloat>(data, n, scratch);
      break;
    default:  // unaligned FP32
      std::memcpy(scratch, data, n * sizeof(float));
      break;
  }
  return scratch;
}

void StoreFloatRow(const float* src, int64_t n, DType dtype, std::byte* dst) {
  switch (dtype) {
    case DType::kBFloat16:
      NarrowRow<NarrowBFloat16, FloatToBFloat16>(src, n, dst);
      break;
    case DType::kFloat16:
      NarrowRow<NarrowFloat16, FloatToFloat16>(src, n, dst);
      break;
    default:
      std::memcpy(dst, src, n * sizeof(float));
      break;
  }
}

}  // namespace klserve::cpu::KLSERVE_ISA
