#ifndef KLSERVE_KERNELS_TENSOR_CHECKS_H_
#define KLSERVE_KERNELS_TENSOR_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/input_dtypes.h"
#include "kernels/tensor_view.h"

// The checks of one request tensor that every form's Create applies, each
// worded "<field>: <rule>, got <value>".

namespace klserve {

// A shape for a message: a few dimensions, not a whole hostile shape.
std::string ShapeString(absl::Span<const int64_t> shape);

absl::Status Invalid(absl::string_view field, absl::string_view rule,
                     absl::string_view got);

absl::Status CheckDType(absl::string_view field, const TensorView& view,
                        DTypeRule rule);

// Rank, positive dims, and no overflow of the byte size.
absl::Status CheckLayout(absl::string_view field, const TensorView& view,
                         absl::string_view layout, size_t rank);

// The bytes of a tensor whose layout is checked: as many as its shape needs,
// and present.
absl::Status CheckBytes(absl::string_view field, const TensorView& view);

// A per-row tensor's bytes, when its view carries any. A view without (a
// stream header's) gives dtype and shape only: the rows come later and are
// checked then.
absl::Status CheckBytesIfAny(absl::string_view field, const TensorView& view);

// Checks a tensor whose shape the problem already fixes. `origin`, when
// given, says in the message where the expected dimensions came from (a
// wrong tensor elsewhere may have set them).
absl::Status CheckTensor(absl::string_view field, const TensorView& view,
                         DTypeRule rule, absl::string_view layout,
                         std::initializer_list<int64_t> expected,
                         absl::string_view origin = {});

// An unaligned little-endian INT32. Inline: the top-k check loads one per
// slot.
inline int32_t LoadInt32(const std::byte* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace klserve

#endif  // KLSERVE_KERNELS_TENSOR_CHECKS_H_
