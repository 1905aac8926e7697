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
  // Four times the row's keys at least, so that at most a quarter of the
  // slots are taken: at half, the probes past the first slot made the
  // sparse benchmark 1.8 times slower.
  const int64_t wanted =
      std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(4 * slots, 16)));
  if (wanted > slots_) {
    slots_ = wanted;
    mask_ = static_cast<uint64_t>(slots_ - 1);
    shift_ = 64 - std::countr_zero(static_cast<uint64_t>(slots_));
    table_.reset(new uint64_t[slots_]);
    Clear();
  }
  const bool marks = S <= bytes();
  if (marks != marks_) {
    marks_ = marks;
    Clear();
  }
  if (marks_) {
    if (++mark_stamp_ == 0) {
      // After 255 rows the stamps start again: forget every row.
      Clear();
      mark_stamp_ = 1;
    }
  } else if (++stamp_ == 0) {
    // After 2^32 - 1 rows.
    Clear();
    stamp_ = 1;
  }
}

void RowKeySet::Clear() {
  std::fill_n(table_.get(), slots_, 0);
  stamp_ = 0;
  mark_stamp_ = 0;
}

void RowKeySet::Release() {
  table_.reset();
  slots_ = 0;
  mask_ = 0;
  shift_ = 64;
}

}  // namespace klserve
