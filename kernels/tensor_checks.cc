#include "kernels/tensor_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"

namespace klserve {

std::string ShapeString(absl::Span<const int64_t> shape) {
  // A message quotes a few dimensions, not a whole hostile shape.
  constexpr size_t kMaxQuoted = 8;
  if (shape.size() <= kMaxQuoted) {
    return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  }
  return absl::StrCat("[", absl::StrJoin(shape.first(kMaxQuoted), ", "),
                      ", ...] (", shape.size(), " dimensions)");
}

absl::Status Invalid(absl::string_view field, absl::string_view rule,
                     absl::string_view got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", rule, ", got ", got));
}

absl::Status CheckDType(absl::string_view field, const TensorView& view,
                        DTypeRule rule) {
  const absl::Span<const DType> allowed = DTypesOf(rule);
  for (DType dtype : allowed) {
    if (view.dtype == dtype) return absl::OkStatus();
  }
  std::string names;
  for (DType dtype : allowed) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", DTypeName(dtype));
  }
  return Invalid(field, absl::StrCat("dtype must be one of ", names),
                 DTypeName(view.dtype));
}

// Rank, positive dims, and no overflow of the byte size.
absl::Status CheckLayout(absl::string_view field, const TensorView& view,
                         absl::string_view layout, size_t rank) {
  if (view.shape.size() != rank) {
    return Invalid(field, absl::StrCat("shape must be ", layout),
                   ShapeString(view.shape));
  }
  for (int64_t dim : view.shape) {
    if (dim <= 0) {
      return Invalid(
          field,
          absl::StrCat("every dimension of ", layout, " must be positive"),
          ShapeString(view.shape));
    }
  }
  if (!ShapeBytes(DTypeSize(view.dtype), view.shape).has_value()) {
    return Invalid(field, "the shape's byte size must fit in 64 bits",
                   ShapeString(view.shape));
  }
  return absl::OkStatus();
}

// The bytes of a tensor whose layout is checked: as many as its shape needs,
// and present.
absl::Status CheckBytes(absl::string_view field, const TensorView& view) {
  int64_t bytes = DTypeSize(view.dtype);
  for (int64_t dim : view.shape) bytes *= dim;
  if (view.byte_size != bytes) {
    return Invalid(
        field,
        absl::StrCat("byte size must be ", bytes, " for shape ",
                     ShapeString(view.shape), " of ", DTypeName(view.dtype)),
        absl::StrCat(view.byte_size));
  }
  if (view.data == nullptr) {
    return Invalid(field, "data must be present", "none");
  }
  return absl::OkStatus();
}

// A per-row tensor's bytes, when its view carries any. A view without
// (a stream header's) gives dtype and shape only: the rows come later, whole
// (WholeRowData) or in blocks (BlockRowData), and are checked there.
absl::Status CheckBytesIfAny(absl::string_view field, const TensorView& view) {
  if (view.data == nullptr && view.byte_size == 0) return absl::OkStatus();
  return CheckBytes(field, view);
}

// Checks a tensor whose shape the problem already fixes.
absl::Status CheckTensor(absl::string_view field, const TensorView& view,
                         DTypeRule rule, absl::string_view layout,
                         std::initializer_list<int64_t> expected,
                         absl::string_view origin) {
  RETURN_IF_ERROR(CheckDType(field, view, rule));
  RETURN_IF_ERROR(CheckLayout(field, view, layout, expected.size()));
  if (!std::equal(expected.begin(), expected.end(), view.shape.begin())) {
    return Invalid(
        field,
        absl::StrCat("shape must be ", layout, " = ", ShapeString(expected),
                     origin.empty() ? "" : " (", origin,
                     origin.empty() ? "" : ")"),
        ShapeString(view.shape));
  }
  return absl::OkStatus();
}

}  // namespace klserve
