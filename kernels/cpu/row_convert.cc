#include "kernels/cpu/row_convert.h"

#include <cstring>

#include "kernels/half.h"

namespace klserve::cpu {

namespace {

// n 16-bit floats at `data` (any alignment) as floats.
template <float (*kToFloat)(uint16_t)>
void WidenRow(const std::byte* data, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + 2 * i, 2);
    out[i] = kToFloat(bits);
  }
}

// n floats as 16-bit floats at `dst` (any alignment).
template <uint16_t (*kFromFloat)(float)>
void NarrowRow(const float* src, int64_t n, std::byte* dst) {
  for (int64_t i = 0; i < n; ++i) {
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
      WidenRow<BFloat16ToFloat>(data, n, scratch);
      break;
    case DType::kFloat16:
      WidenRow<Float16ToFloat>(data, n, scratch);
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
      NarrowRow<FloatToBFloat16>(src, n, dst);
      break;
    case DType::kFloat16:
      NarrowRow<FloatToFloat16>(src, n, dst);
      break;
    default:
      std::memcpy(dst, src, n * sizeof(float));
      break;
  }
}

}  // namespace klserve::cpu
