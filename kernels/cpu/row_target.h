#ifndef KLSERVE_KERNELS_CPU_ROW_TARGET_H_
#define KLSERVE_KERNELS_CPU_ROW_TARGET_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cpu/row_passes.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/row_validity.h"
#include "kernels/problem.h"

namespace klserve::cpu {

// The target of one row as weights w (zero on invalid slots, defined on
// [0, validity.limit)) and a normaliser Z, p = w / Z. Per-head logits give
// w = sum_h P_h with Z = H (MAXTEXT: H + 1e-8); head-aggregated weights give
// w = X with Z = sum of valid X (MAXTEXT: + 1e-8).
struct RowTarget {
  const float* w = nullptr;
  double z = 0;
  bool zero = false;  // valid keys, but no target mass on them
};

// Reads row r of the target, checks its values everywhere in the row (NaN,
// +inf; for weights also negatives; for logits a head with no finite valid
// logit) and builds w. With no valid slot only the checks run. `next`
// fetches the next row while the weights stream in; per-head rows also
// fetch each next head as they go.
absl::StatusOr<RowTarget> LoadRowTarget(const IndexerKlProblem& problem,
                                        const RowData& data, int64_t r,
                                        const RowValidity& validity,
                                        Prefetcher& next, RowScratch& scratch);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ROW_TARGET_H_
