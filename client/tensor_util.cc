#include "client/tensor_util.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/request_tensors.h"

namespace klserve {

absl::StatusOr<int64_t> WireDTypeSize(absl::string_view dtype) {
  if (dtype == "FP32" || dtype == "INT32") return 4;
  if (dtype == "BF16" || dtype == "FP16") return 2;
  if (dtype == "BOOL") return 1;
  if (dtype == "FP64") return 8;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: must be FP32, BF16, FP16, INT32, BOOL or FP64, "
                   "got \"",
                   dtype, "\""));
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape: dimensions must be >= 0, got [",
                       absl::StrJoin(shape, ","), "]"));
    }
    if (__builtin_mul_overflow(count, dim, &count)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape: element count overflows, got [",
                       absl::StrJoin(shape, ","), "]"));
    }
  }
  return count;
}

absl::StatusOr<int64_t> ExpectedTensorBytes(absl::string_view dtype,
                                            absl::Span<const int64_t> shape) {
  absl::StatusOr<int64_t> element_size = WireDTypeSize(dtype);
  if (!element_size.ok()) return element_size.status();
  absl::StatusOr<int64_t> count = NumElements(shape);
  if (!count.ok()) return count.status();
  int64_t bytes = 0;
  if (__builtin_mul_overflow(*count, *element_size, &bytes)) {
    return absl::InvalidArgumentError("shape: byte count overflows");
  }
  return bytes;
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
