#include "server/service/region_answer_checks.h"

#include <cmath>
#include <cstddef>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/non_finite.h"

namespace klserve::server {
namespace {

absl::Status CameOut(absl::string_view region, absl::string_view what,
                     absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat("region '", region, "': ", what, " came out ", value,
                   ": an input changed while the server read it"));
}

}  // namespace

absl::Status CheckResultFinite(absl::string_view region,
                               const IndexerKlResult& result) {
  std::pair<const char*, double> values[5] = {
      {"the loss", result.loss}, {"unscaled_loss", result.unscaled_loss}};
  int n = 2;
  if (const std::optional<Diagnostics>& d = result.diagnostics) {
    values[n++] = {"diagnostics.mean_entropy_p", d->mean_entropy_p};
    values[n++] = {"diagnostics.mean_entropy_q", d->mean_entropy_q};
    if (d->topk_recall)
      values[n++] = {"diagnostics.topk_recall", *d->topk_recall};
  }
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(values[i].second)) {
      return CameOut(region, values[i].first, absl::StrCat(values[i].second));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGradientFinite(absl::string_view region, DType dtype,
                                 const void* grad, int64_t bytes) {
  const int64_t i = FirstNonFinite(dtype, static_cast<const std::byte*>(grad),
                                   bytes / DTypeSize(dtype),
                                   /*infinities_allowed=*/false);
  if (i < 0) return absl::OkStatus();
  return CameOut(region, absl::StrCat("the gradient at element ", i),
                 "NaN or infinite");
}

}  // namespace klserve::server
