#ifndef KLSERVE_KERNELS_ROW_KEY_SET_H_
#define KLSERVE_KERNELS_ROW_KEY_SET_H_

#include <cstdint>
#include <memory>

namespace klserve {

// The keys one top-k row has named so far, for the duplicate check. Its
// memory is O(K), whatever S is: an open-addressing table of at least 4K
// slots (so that a probe mostly ends at its first slot), each holding a key
// and the stamp of the row that wrote it. A new row takes a new stamp, so
// nothing is cleared per row, and once the table fits the widest row nothing
// is allocated per row either.
class RowKeySet {
 public:
  RowKeySet();

  // Empties the set for a row of at most `slots` keys, each in [0, S).
  void StartRow(int64_t slots, int64_t S);
  // The first j in [0, K) whose key_at(j) (a key >= 0, or -1 for none) an
  // earlier j of the row named, or -1; every key before it joins the set.
  // One loop over the row, with the table's fields in locals: a store into
  // the table could otherwise alias them and reload them per key.
  template <typename KeyAt>
  int64_t FirstRepeat(int64_t K, KeyAt key_at) {
    uint64_t* const table = table_.get();
    const uint64_t mask = mask_, multiplier = multiplier_;
    const int shift = shift_;
    const uint64_t stamp = stamp_;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t key = key_at(j);
      if (key == -1) continue;
      const uint64_t tagged = (stamp << 32) | static_cast<uint32_t>(key);
      for (uint64_t i = (static_cast<uint64_t>(key) * multiplier) >> shift;;
           i = (i + 1) & mask) {
        const uint64_t entry = table[i];
        if (entry == tagged) return j;
        if (entry >> 32 != stamp) {  // empty, or another row's
          table[i] = tagged;
          break;
        }
      }
    }
    return -1;
  }

  int64_t bytes() const { return slots_ * int64_t{sizeof(uint64_t)}; }
  // Frees the table; the next StartRow allocates one again.
  void Release();

 private:
  std::unique_ptr<uint64_t[]> table_;
  int64_t slots_ = 0;   // a power of two, or 0 while unallocated
  uint64_t mask_ = 0;   // slots_ - 1
  int shift_ = 64;      // 64 - log2(slots_)
  uint32_t stamp_ = 0;  // the current row's; 0 marks a slot never written
  // A key's first slot: multiply-shift hashing, the top bits of
  // key * multiplier_; or the key itself (multiplier 1, shift 0) when S fits
  // in the table, which then has no collisions.
  uint64_t multiplier_ = 1;
  // Random (and odd) per set: with a fixed one a client could send keys that
  // all land in one run of slots, making each row cost O(K^2) probes. Which
  // slots the keys take never changes the answer.
  uint64_t hash_multiplier_;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_ROW_KEY_SET_H_
