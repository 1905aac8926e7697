#ifndef KLSERVE_KERNELS_VALUE_ERRORS_H_
#define KLSERVE_KERNELS_VALUE_ERRORS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

// The INVALID_ARGUMENT errors a backend raises for bad values in the data,
// shared so that every backend words them alike:
// "<tensor>: <rule>, got <what> at [b, t, j]".

namespace klserve {

absl::Status ValueError(absl::string_view tensor, absl::string_view rule,
                        absl::string_view got,
                        std::initializer_list<int64_t> position);

// The first element of `x[0, n)` that breaks the rule for logits/scores (NaN
// or +inf) or, with `weights`, for head-aggregated weights (NaN, negative or
// +inf); -1 if none. Scalar: called only once a vector pass saw a bad value.
int64_t FirstBadValue(const float* x, int64_t n, bool weights);

// "NaN", "+inf" or the number.
std::string DescribeValue(float value);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_VALUE_ERRORS_H_
