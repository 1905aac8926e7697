#include "kernels/value_errors.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace klserve {

absl::Status ValueError(absl::string_view tensor, absl::string_view rule,
                        absl::string_view got,
                        std::initializer_list<int64_t> position) {
  return absl::InvalidArgumentError(
      absl::StrCat(tensor, ": ", rule, ", got ", got, " at [",
                   absl::StrJoin(position, ", "), "]"));
}

int64_t FirstBadValue(const float* x, int64_t n, bool weights) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (std::isnan(v) || v == INFINITY || (weights && v < 0)) return i;
  }
  return -1;
}

std::string DescribeValue(float value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+inf" : "-inf";
  return absl::StrCat(value);
}

}  // namespace klserve
