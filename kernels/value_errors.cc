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

int64_t BadValueToReport(const float* x, int64_t n, bool weights) {
  const int64_t j = FirstBadValue(x, n, weights);
  return j < 0 ? 0 : j;
}

std::string DescribeValue(float value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+inf" : "-inf";
  return absl::StrCat(value);
}

absl::Status RowErrorStatus(RowError error, const RowErrorSite& s) {
  switch (error) {
    case RowError::kNone:
      return absl::OkStatus();
    case RowError::kLogitsNotFinite:
      return ValueError("attention_logits", "logits must not be NaN or +inf",
                        DescribeValue(s.value), {s.b, s.h, s.t, s.j});
    case RowError::kLogitsAllMinusInf:
      return ValueError("attention_logits",
                        "a head needs a finite logit at some valid key",
                        "-inf at every valid key", {s.b, s.h, s.t});
    case RowError::kWeightsBad:
      return ValueError("attention_weights", "weights must be finite and >= 0",
                        DescribeValue(s.value), {s.b, s.t, s.j});
    case RowError::kScoresNotFinite:
      return ValueError("indexer_scores", "scores must not be NaN or +inf",
                        DescribeValue(s.value), {s.b, s.t, s.j});
    case RowError::kScoresAllMinusInf:
      return ValueError("indexer_scores",
                        "a row with valid keys needs a finite score at one",
                        "-inf at every valid key", {s.b, s.t});
    case RowError::kMinusInfWithMass:
      return ValueError("indexer_scores",
                        "EXACT needs a finite score wherever the target has "
                        "mass (the KL would be infinite; MAXTEXT computes it)",
                        "-inf", {s.b, s.t, s.j});
  }
  return absl::InternalError("unknown row error code");
}

}  // namespace klserve
