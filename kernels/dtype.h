#ifndef KLSERVE_KERNELS_DTYPE_H_
#define KLSERVE_KERNELS_DTYPE_H_

#include <cstdint>

namespace klserve {

// Element types a tensor may carry on the wire (little-endian, row-major).
// BOOL is one byte per element, nonzero meaning true (the KServe v2 layout).
enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kInt32, kBool };

// Every dtype a request's tensor may have, and the floating ones: what the
// loss takes as inputs and gives as gradients (GetServerInfo lists them).
inline constexpr DType kWireDTypes[] = {DType::kFloat32, DType::kBFloat16,
                                        DType::kFloat16, DType::kInt32,
                                        DType::kBool};
inline constexpr DType kFloatDTypes[] = {DType::kFloat32, DType::kBFloat16,
                                         DType::kFloat16};

// Bytes per element. Defined here, as DTypeName, for the client, which
// names dtypes without linking the kernels.
constexpr int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kBool:
      return 1;
  }
  return 0;
}

// Wire name: "FP32", "BF16", "FP16", "INT32", "BOOL".
constexpr const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "FP32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "FP16";
    case DType::kInt32:
      return "INT32";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

// True for the kFloatDTypes.
bool IsFloatDType(DType dtype);
// The largest finite value of a float dtype (0 for the others).
double LargestFinite(DType dtype);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_DTYPE_H_
