#ifndef KLSERVE_KERNELS_CPU_VARIANT_ROW_LOSS_H_
#define KLSERVE_KERNELS_CPU_VARIANT_ROW_LOSS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/cpu/variant/row_passes.h"
#include "kernels/cpu/variant/row_target.h"
#include "kernels/cpu/variant/row_validity.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"

namespace klserve::cpu::KLSERVE_ISA {

// Row r's KL, diagnostics and gradient, given its validity: reads and
// checks the target (NaN or +inf anywhere, negative weights, a head with no
// finite valid logit) and the scores (NaN or +inf anywhere; a valid row needs
// a finite score at some valid slot; EXACT needs a finite score wherever
// p > 0). When `grad` is given it receives grad_scale * dKL/dI on all K slots
// (0 on invalid slots and for rows without a KL); `grad_is_output` says it
// is the response's buffer, which nothing reads again, so that the row is
// written past the cache. `next` names the next row's data, fetched into
// cache while this row computes.
absl::StatusOr<RowResult> ComputeRowLoss(const IndexerKlProblem& problem,
                                         const RowData& data, int64_t r,
                                         const RowValidity& validity,
                                         float grad_scale, float* grad,
                                         bool grad_is_output, Prefetcher& next,
                                         RowScratch& scratch);

// The same from a target already built (w zero on invalid slots, as
// RowTarget says) and scores already in float, both `problem.row_length`
// long: the projections form, which forms both from its projections tile by
// tile. The scores are checked as ComputeRowLoss checks them.
absl::StatusOr<RowResult> ComputeRowLossFromTarget(
    const IndexerKlProblem& problem, int64_t r, const RowValidity& validity,
    const RowTarget& target, const float* scores, float grad_scale, float* grad,
    RowScratch& scratch);

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ROW_LOSS_H_
