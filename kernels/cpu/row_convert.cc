#include "kernels/cpu/row_convert.h"

#include <cstring>

#include "kernels/half.h"

namespace klserve::cpu {

const float* FloatRow(DType dtype, const std::byte* data, int64_t n,
                      float* scratch) {
  if (IsDirectFloat(dtype, data)) return reinterpret_cast<const float*>(data);
  switch (dtype) {
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * i, 2);
        scratch[i] = BFloat16ToFloat(bits);
      }
      break;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * i, 2);
        scratch[i] = Float16ToFloat(bits);
      }
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
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t bits = FloatToBFloat16(src[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      break;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t bits = FloatToFloat16(src[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      break;
    default:
      std::memcpy(dst, src, n * sizeof(float));
      break;
  }
}

}  // namespace klserve::cpu
