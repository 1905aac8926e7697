#ifndef KLSERVE_KERNELS_TENSOR_VIEW_H_
#define KLSERVE_KERNELS_TENSOR_VIEW_H_

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "kernels/dtype.h"

namespace klserve {

// A read-only view of a dense tensor: raw little-endian row-major bytes.
// The view does not own `data`; whoever built it (for the server, the request
// message) keeps the bytes alive until the computation that reads them ends.
// `data` needs no particular alignment.
struct TensorView {
  DType dtype = DType::kFloat32;
  absl::InlinedVector<int64_t, 4> shape;
  const void* data = nullptr;
  int64_t byte_size = 0;  // bytes readable at `data`
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_TENSOR_VIEW_H_
