#ifndef KLSERVE_KERNELS_ROW_KEY_SET_H_
#define KLSERVE_KERNELS_ROW_KEY_SET_H_

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>

namespace klserve {

// The keys one top-k row has named so far, for the duplicate check. Its
// memory is O(K), whatever S is: a table of 8-byte slots, at least 4K of
// them for rows of up to kHashedKeysAtMost keys, used one of three ways.
// - Marks, when S fits in the table's bytes (S <= 8 * slots): one byte per
//   key holding the stamp of the row that named it. A row's keys touch
//   S bytes, which stay in L1 for the usual S (4 KiB for S = 4096; the
//   slots of K = 2048 keys take 64 KiB), and no key waits on another's
//   probe.
// - Open addressing otherwise: each slot holds a key and the stamp of the
//   row that wrote it, at most a quarter of the slots are taken, so a probe
//   mostly ends at its first slot.
// - Sorted, for a row wider than kHashedKeysAtMost (no model's; a request
//   can make one): its keys with their slots, sorted, in at most 16 bytes a
//   key, where open addressing took up to 64 (a 240 MiB request of one
//   20-million-key row took a 1 GiB table).
// A new row takes a new stamp, so nothing is cleared per row, and once the
// table fits the widest row nothing is allocated per row either.
class RowKeySet {
 public:
  RowKeySet();

  // Empties the set for a row of at most `slots` keys over S < 2^31 keys.
  void StartRow(int64_t slots, int64_t S);
  // The first j in [0, K) whose key_at(j) an earlier j of the row named, or
  // -1; every key before it joins the set. An int32 outside [0, S) names no
  // key (an empty slot), so it never repeats. One loop over the row, with
  // the table's fields in locals: a store into the table could otherwise
  // alias them and reload them per key.
  template <typename KeyAt>
  int64_t FirstRepeat(int64_t K, KeyAt key_at) {
    // As unsigned, a negative key lies above every S < 2^31: one compare.
    const uint32_t S = static_cast<uint32_t>(S_);
    const auto names_no_key = [S](int32_t key) {
      return static_cast<uint32_t>(key) >= S;
    };
    if (use_ == Use::kSorted) {
      // (key, slot) as one integer: sorted, equal keys lie together in
      // slot order, and each run's second slot is a repeat.
      uint64_t* const entries = table_.get();
      int64_t n = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t key = key_at(j);
        if (names_no_key(key)) continue;
        entries[n++] = (uint64_t{static_cast<uint32_t>(key)} << 32) |
                       static_cast<uint64_t>(j);
      }
      std::sort(entries, entries + n);
      int64_t first = -1;
      for (int64_t i = 1; i < n; ++i) {
        if (entries[i] >> 32 == entries[i - 1] >> 32) {
          const int64_t j = static_cast<int64_t>(entries[i] & 0xffffffffu);
          if (first < 0 || j < first) first = j;
        }
      }
      return first;
    }
    if (use_ == Use::kMarks) {
      uint8_t* const marks = reinterpret_cast<uint8_t*>(table_.get());
      const uint8_t stamp = static_cast<uint8_t>(stamp_);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t key = key_at(j);
        if (names_no_key(key)) continue;
        if (marks[key] == stamp) return j;
        marks[key] = stamp;
      }
      return -1;
    }
    uint64_t* const table = table_.get();
    const uint64_t mask = static_cast<uint64_t>(slots_ - 1);
    const uint64_t multiplier = hash_multiplier_;
    const int shift = 64 - std::countr_zero(static_cast<uint64_t>(slots_));
    const uint64_t stamp = stamp_;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t key = key_at(j);
      if (names_no_key(key)) continue;
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
  // What the table takes for rows of at most `keys` keys.
  static int64_t MaxBytesFor(int64_t keys) {
    return TableSlots(keys) * int64_t{sizeof(uint64_t)};
  }
  // The widest row kept in open addressing: 512 KiB of table at most.
  static constexpr int64_t kHashedKeysAtMost = int64_t{1} << 14;
  // Frees the table; the next StartRow allocates one again.
  void Release();

 private:
  // Four times a row's keys at least, so that at most a quarter of the
  // slots are taken: at half, the probes past the first slot made the
  // sparse benchmark 1.8 times slower. A wider row's keys are sorted, one
  // slot each. A power of two either way, as open addressing needs.
  static int64_t TableSlots(int64_t keys) {
    return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(
        keys > kHashedKeysAtMost ? keys : std::max<int64_t>(4 * keys, 16))));
  }
  // Zeroes the table (no row's stamp in either use) and restarts the stamps.
  void Clear();

  std::unique_ptr<uint64_t[]> table_;
  int64_t slots_ = 0;  // a power of two, or 0 while unallocated
  int64_t S_ = 0;      // the current row's number of keys
  // How the current row uses the table. The uses read the same bytes
  // differently, so switching clears the table.
  enum class Use { kHashed, kMarks, kSorted };
  Use use_ = Use::kHashed;
  // The current row's stamp (marks and open addressing); 0 is no row's.
  // Marks hold its low byte, and take stamps up to 255 only.
  uint32_t stamp_ = 0;
  // A key's first slot is the top bits of key * hash_multiplier_,
  // random (and odd) per set: with a fixed one a client could send keys that
  // all land in one run of slots, making each row cost O(K^2) probes. Which
  // slots the keys take never changes the answer.
  uint64_t hash_multiplier_;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_ROW_KEY_SET_H_
