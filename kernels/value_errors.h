#ifndef KLSERVE_KERNELS_VALUE_ERRORS_H_
#define KLSERVE_KERNELS_VALUE_ERRORS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/row_rules.h"

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

// FirstBadValue for the error report once a pass saw a bad value: 0 when
// this second look finds none, as happens only when the input changed in
// between (a shared-memory region its client rewrote while the server read
// it, docs/shared-memory.md), so that the report never reads x[-1].
int64_t BadValueToReport(const float* x, int64_t n, bool weights);

// "NaN", "+inf" or the number.
std::string DescribeValue(float value);

// Where a row broke a value rule: row (b, t), head h (the attention_logits
// errors) and slot j with the value found there (the errors that name one).
struct RowErrorSite {
  int64_t b = 0, t = 0, h = 0, j = 0;
  float value = 0;
};

// The catalogue of the row errors: `error` at `site` as its ValueError, the
// one wording of every backend; OK for RowError::kNone.
absl::Status RowErrorStatus(RowError error, const RowErrorSite& site);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_VALUE_ERRORS_H_
