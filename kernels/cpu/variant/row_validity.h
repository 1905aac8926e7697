#ifndef KLSERVE_KERNELS_CPU_VARIANT_ROW_VALIDITY_H_
#define KLSERVE_KERNELS_CPU_VARIANT_ROW_VALIDITY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/problem.h"

namespace klserve::cpu::KLSERVE_ISA {

// Which slots of one row may be used: those below `limit` whose byte in
// `bytes` is nonzero, or all below `limit` when `bytes` is null.
struct RowValidity {
  int64_t limit = 0;
  const uint8_t* bytes = nullptr;
  int64_t count = 0;  // valid slots
  // The sparse stage's row of topk_indices: slot s is key
  // LoadInt32(keys + 4 * s). Null in the dense forms, where slot s is key s.
  const std::byte* keys = nullptr;
};

// The mask of row r from every mask the problem carries. In the sparse stage
// an index outside [0, S) (-1 or any other) leaves its slot empty, and no
// key may be named twice (INVALID_ARGUMENT otherwise).
absl::StatusOr<RowValidity> BuildRowValidity(const IndexerKlProblem& problem,
                                             const RowData& data, int64_t r,
                                             RowScratch& scratch);

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ROW_VALIDITY_H_
