#ifndef KLSERVE_KERNELS_CPU_VARIANT_ROW_CONVERT_H_
#define KLSERVE_KERNELS_CPU_VARIANT_ROW_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/dtype.h"

namespace klserve::cpu::KLSERVE_ISA {

// n elements of `dtype` (FP32, BF16 or FP16) at `data` as floats: the bytes
// themselves when they are aligned FP32, otherwise converted into `scratch`.
const float* FloatRow(DType dtype, const std::byte* data, int64_t n,
                      float* scratch);

// Writes n floats to `dst` as `dtype`, rounding to nearest even.
void StoreFloatRow(const float* src, int64_t n, DType dtype, std::byte* dst);

// Whether floats may be written to `dst` directly.
inline bool IsDirectFloat(DType dtype, const void* p) {
  return dtype == DType::kFloat32 &&
         reinterpret_cast<uintptr_t>(p) % alignof(float) == 0;
}

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ROW_CONVERT_H_
