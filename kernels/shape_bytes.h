#ifndef KLSERVE_KERNELS_SHAPE_BYTES_H_
#define KLSERVE_KERNELS_SHAPE_BYTES_H_

// The byte size of a shape, for every check that bounds one: the kernels',
// the server's codec and limits, and the client's. Header-only: the client
// does not link the kernels.

#include <cstdint>
#include <optional>

#include "absl/types/span.h"

namespace klserve {

// element_bytes * prod(dims), or nullopt when a product passes int64. The
// dimensions are taken as they are: each caller refuses the signs it must,
// in its own words, before asking.
inline std::optional<int64_t> ShapeBytes(int64_t element_bytes,
                                         absl::Span<const int64_t> dims) {
  int64_t bytes = element_bytes;
  for (const int64_t dim : dims) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) return std::nullopt;
  }
  return bytes;
}

}  // namespace klserve

#endif  // KLSERVE_KERNELS_SHAPE_BYTES_H_
