#include "kernels/topk_check.h"

#include "absl/strings/str_cat.h"
#include "kernels/tensor_checks.h"
#include "kernels/value_errors.h"

namespace klserve {

absl::Status CheckTopkRow(const std::byte* indices_row, int64_t K, int64_t S,
                          int64_t b, int64_t t, RowKeySet& keys) {
  keys.StartRow(K, S);
  const int64_t j = keys.FirstRepeat(
      K, [&](int64_t slot) { return LoadInt32(indices_row + 4 * slot); });
  if (j >= 0) {
    return ValueError(
        "topk_indices", "a key may appear once per row",
        absl::StrCat("key ", LoadInt32(indices_row + 4 * j), " again"),
        {b, t, j});
  }
  return absl::OkStatus();
}

}  // namespace klserve
