#include "client/tensor_util.h"

#include <optional>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/dtype.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"

namespace klserve {

absl::StatusOr<int64_t> WireDTypeSize(absl::string_view dtype) {
  for (const DType wire : kWireDTypes) {
    if (dtype == DTypeName(wire)) return DTypeSize(wire);
  }
  if (dtype == "FP64") return 8;  // row_kl's, an output only
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype: must be ",
      absl::StrJoin(kWireDTypes, ", ",
                    [](std::string* out, DType wire) {
                      out->append(DTypeName(wire));
                    }),
      " or FP64, got \"", dtype, "\""));
}

absl::StatusOr<int64_t> ExpectedTensorBytes(absl::string_view dtype,
                                            absl::Span<const int64_t> shape) {
  ASSIGN_OR_RETURN(const int64_t element_size, WireDTypeSize(dtype));
  if (absl::c_any_of(shape, [](int64_t dim) { return dim < 0; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape: dimensions must be >= 0, got [",
                     absl::StrJoin(shape, ","), "]"));
  }
  const std::optional<int64_t> bytes = ShapeBytes(element_size, shape);
  if (!bytes.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape: the byte count overflows int64, got [",
                     absl::StrJoin(shape, ","), "]"));
  }
  return *bytes;
}

absl::Status CheckTensorBytes(absl::string_view field,
                              const v1::Tensor& tensor) {
  absl::StatusOr<int64_t> expected =
      ExpectedTensorBytes(tensor.dtype(), tensor.shape());
  if (!expected.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".", expected.status().message()));
  }
  if (static_cast<int64_t>(tensor.data().size()) != *expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": data must be ", *expected, " bytes for ",
                     tensor.dtype(), " [", absl::StrJoin(tensor.shape(), ","),
                     "], got ", tensor.data().size()));
  }
  return absl::OkStatus();
}

int64_t RequestTensorBytes(const v1::ComputeLossRequest& request) {
  int64_t total = 0;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (const v1::Tensor* t = FindTensor(request, tensor)) {
      total += t->data().size();
    }
  }
  return total;
}

bool UsesRegions(const v1::ComputeLossRequest& request) {
  return !CheckNoRegions(request).ok();
}

absl::Status CheckNoRegions(const v1::ComputeLossRequest& request) {
  for (const RequestTensor& tensor : kRequestTensors) {
    const v1::Tensor* t = FindTensor(request, tensor);
    if (t != nullptr && t->has_region()) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor.name,
                       ".region: shared-memory regions are for the unary "
                       "ComputeLoss only; the stream carries bytes inline"));
    }
  }
  if (request.has_outputs()) {
    return absl::InvalidArgumentError(
        "outputs: shared-memory regions are for the unary ComputeLoss only; "
        "the stream returns its outputs inline");
  }
  return absl::OkStatus();
}

}  // namespace klserve
