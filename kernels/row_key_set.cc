#include "kernels/row_key_set.h"

#include <algorithm>
#include <bit>
#include <random>

namespace klserve {

RowKeySet::RowKeySet() {
  std::random_device entropy;
  hash_multiplier_ = ((uint64_t{entropy()} << 32) | entropy()) | 1;
}

void RowKeySet::StartRow(int64_t slots, int64_t S) {
  S_ = S;
  const int64_t wanted = TableSlots(slots);
  if (wanted > slots_) {
    slots_ = wanted;
    table_.reset(new uint64_t[slots_]);
    Clear();
  }
  const Use use = S <= bytes()                ? Use::kMarks
                  : slots > kHashedKeysAtMost ? Use::kSorted
                                              : Use::kHashed;
  if (use != use_) {
    use_ = use;
    Clear();
  }
  // After the last stamp of its use, the stamps start again: forget every
  // row.
  if (stamp_ == (use_ == Use::kMarks ? 255 : UINT32_MAX)) Clear();
  ++stamp_;
}

void RowKeySet::Clear() {
  std::fill_n(table_.get(), slots_, 0);
  stamp_ = 0;
}

void RowKeySet::Release() {
  table_.reset();
  slots_ = 0;
}

}  // namespace klserve
