#ifndef KLSERVE_KERNELS_TOPK_CHECK_H_
#define KLSERVE_KERNELS_TOPK_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/row_key_set.h"

// The sparse stage's index rules for one row, shared by the backends so that
// they report bad indices alike.

namespace klserve {

// Checks row (b, t) of topk_indices: K INT32 values at `indices_row` (any
// alignment), no key in [0, S) named twice:
//   "topk_indices: a key may appear once per row, got key <K> again at
//    [b, t, j]" (INVALID_ARGUMENT).
// Any other value, -1 or not, names no key: its slot is empty (the
// contract's slot rule), and may appear any number of times.
// `keys` is the caller's, reused from row to row: its memory is O(K), so
// that a request cannot make the check allocate by naming a large S.
absl::Status CheckTopkRow(const std::byte* indices_row, int64_t K, int64_t S,
                          int64_t b, int64_t t, RowKeySet& keys);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_TOPK_CHECK_H_
