#include "kernels/dtype.h"

#include "absl/algorithm/container.h"

namespace klserve {

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
