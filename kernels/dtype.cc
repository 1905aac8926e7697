#include "kernels/dtype.h"

#include "absl/algorithm/container.h"

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

double LargestFinite(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 0x1.FFFFFEp127;
    case DType::kBFloat16:
      return 0x1.FEp127;
    case DType::kFloat16:
      return 65504;
    case DType::kInt32:
    case DType::kBool:
      break;
  }
  return 0;
}

bool IsFloatDType(DType dtype) {
  return absl::c_linear_search(kFloatDTypes, dtype);
}

}  // namespace klserve
