#ifndef KLSERVE_CLIENT_TENSOR_UTIL_H_
#define KLSERVE_CLIENT_TENSOR_UTIL_H_

// Small helpers over klserve.v1.Tensor shared by the client modules.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve {

// Bytes per element of a wire dtype ("FP32", "BF16", "FP16", "INT32",
// "BOOL", "FP64"). INVALID_ARGUMENT for any other name.
absl::StatusOr<int64_t> WireDTypeSize(absl::string_view dtype);

// prod(shape) * element size: the byte count a tensor's data must have.
// INVALID_ARGUMENT for an unknown dtype, a negative dimension or a product
// that overflows int64.
absl::StatusOr<int64_t> ExpectedTensorBytes(absl::string_view dtype,
                                            absl::Span<const int64_t> shape);

// Checks that `tensor`'s data size matches its dtype and shape; errors are
// INVALID_ARGUMENT starting with `field`.
absl::Status CheckTensorBytes(absl::string_view field,
                              const v1::Tensor& tensor);

// Sum of the data sizes of every tensor in `request` (what travels as
// tensor bytes; the protobuf framing is not counted).
int64_t RequestTensorBytes(const v1::ComputeLossRequest& request);

// Whether `request` names a shared-memory region: a tensor's `region`, or
// `outputs`.
bool UsesRegions(const v1::ComputeLossRequest& request);

// INVALID_ARGUMENT naming the first field of `request` that names a region
// ("<tensor>.region: ..." or "outputs: ..."), for paths that carry bytes
// inline only (the stream).
absl::Status CheckNoRegions(const v1::ComputeLossRequest& request);

}  // namespace klserve

#endif  // KLSERVE_CLIENT_TENSOR_UTIL_H_
