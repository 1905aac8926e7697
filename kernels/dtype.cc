#include "kernels/dtype.h"

namespace klserve {

int64_t DTypeSize(DType dtype) {
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

const char* DTypeName(DType dtype) {
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

bool IsFloatDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

}  // namespace klserve
