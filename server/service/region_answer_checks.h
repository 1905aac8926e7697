#ifndef KLSERVE_SERVER_SERVICE_REGION_ANSWER_CHECKS_H_
#define KLSERVE_SERVER_SERVICE_REGION_ANSWER_CHECKS_H_

// Checks of an answer computed from inputs in shared-memory regions. The
// kernels read such an input in place, in more than one pass (a check, then
// the math), and the client may rewrite it in between: a value that passed
// the check may not be the one computed with. Whatever comes out of that is
// the client's doing, but an answer is never sent with a NaN or an infinity
// in it (docs/shared-memory.md).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/loss_computation.h"

namespace klserve::server {

// INVALID_ARGUMENT naming `region` (the call's first) and the first of the
// loss, unscaled_loss and diagnostics that is not finite.
absl::Status CheckResultFinite(absl::string_view region,
                               const IndexerKlResult& result);

// INVALID_ARGUMENT naming `region` when the `bytes` of a gradient in
// `dtype` at `grad` hold a NaN or an infinity, with its index.
absl::Status CheckGradientFinite(absl::string_view region, DType dtype,
                                 const void* grad, int64_t bytes);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_REGION_ANSWER_CHECKS_H_
