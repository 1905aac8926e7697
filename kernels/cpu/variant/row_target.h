#ifndef KLSERVE_KERNELS_CPU_VARIANT_ROW_TARGET_H_
#define KLSERVE_KERNELS_CPU_VARIANT_ROW_TARGET_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/cpu/variant/row_passes.h"
#include "kernels/cpu/variant/row_validity.h"
#include "kernels/problem.h"

namespace klserve::cpu::KLSERVE_ISA {

// The target of one row as weights w (zero on invalid slots, defined on
// [0, validity.limit)) and a normaliser Z, p = w / Z. Per-head logits give
// w = sum_h P_h with Z = H (MAXTEXT: H + 1e-8); head-aggregated weights give
// w = X with Z = sum of valid X (MAXTEXT: + 1e-8).
struct RowTarget {
  const float* w = nullptr;
  double z = 0;
  bool zero = false;  // valid keys, but no target mass on them
};

// Reads row r's per-head logits, checks them everywhere in the row (NaN,
// +inf, a head with no finite valid logit) and builds w. With no valid slot
// only the checks run and w is left undefined. Each head's exponentials run
// while the next head streams in.
absl::StatusOr<RowTarget> LoadPerHeadTarget(const IndexerKlProblem& problem,
                                            const RowData& data, int64_t r,
                                            const RowValidity& validity,
                                            RowScratch& scratch);

// The head-aggregated target once ScanRow has summed its valid weights:
// p = w / Z with Z from `weight_sum`. Keeps 1 / Z a normal float by scaling
// w and Z alike by a power of two when Z is extreme (p is unchanged); the
// scaled row then goes to scratch and `rescaled` is set.
RowTarget AggregatedTarget(const IndexerKlProblem& problem,
                           const RowValidity& validity, const float* w,
                           double weight_sum, RowScratch& scratch,
                           bool& rescaled);

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ROW_TARGET_H_
