// RowKeySet, the sparse duplicate check's set, against a std::set of the
// keys seen, over rows that switch between its two uses (marks for small S,
// open addressing for large S) and run past the wrap of its stamps.

#include "kernels/row_key_set.h"

#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace klserve {
namespace {

// The first slot whose key an earlier slot named, or -1. An index outside
// [0, S) names no key.
int64_t FirstRepeatByHand(const std::vector<int32_t>& row, int64_t S) {
  std::set<int32_t> seen;
  for (size_t j = 0; j < row.size(); ++j) {
    if (row[j] < 0 || row[j] >= S) continue;
    if (!seen.insert(row[j]).second) return static_cast<int64_t>(j);
  }
  return -1;
}

// A row of k keys in [0, S), distinct, with empty slots mixed in (-1, or
// now and then another index outside [0, S): S, -2, the int32 extremes,
// repeated), and with probability 1/2 one slot repeating an earlier key.
std::vector<int32_t> RandomRow(int64_t k, int64_t S, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> key(0, S - 1);
  const int32_t empties[] = {-1, -1,        -1,       static_cast<int32_t>(S),
                             -2, INT32_MAX, INT32_MIN};
  std::set<int32_t> used;
  std::vector<int32_t> row;
  while (static_cast<int64_t>(row.size()) < k) {
    if (rng() % 5 == 0) {
      row.push_back(empties[rng() % std::size(empties)]);
      continue;
    }
    const int32_t x = static_cast<int32_t>(key(rng));
    if (static_cast<int64_t>(used.size()) < S && used.insert(x).second) {
      row.push_back(x);
    } else if (static_cast<int64_t>(used.size()) == S) {
      row.push_back(-1);
    }
  }
  if (rng() % 2 == 0 && k >= 2) {
    const size_t from = rng() % (k - 1), to = from + 1 + rng() % (k - 1 - from);
    if (row[from] >= 0 && row[from] < S) row[to] = row[from];
  }
  return row;
}

TEST(RowKeySet, AgreesWithASetAcrossUsesAndStampWraps) {
  std::mt19937_64 rng(12);
  RowKeySet keys;
  // Row widths and key ranges that take each use, switching often: S up to
  // 8 * 4k bytes uses marks, beyond it open addressing, and rows wider than
  // kHashedKeysAtMost sort their keys (but for marks, with S small).
  constexpr int64_t kWide = RowKeySet::kHashedKeysAtMost + 1;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4, 8},
                                                           {4, 100},
                                                           {64, 2048},
                                                           {64, 2049},
                                                           {300, 5000},
                                                           {300, 1 << 20},
                                                           {1, 1},
                                                           {2, 2},
                                                           {50, 60},
                                                           {16, 16 * 32},
                                                           {16, 16 * 32 + 1},
                                                           {kWide, 1 << 30},
                                                           {kWide, 3 * kWide}};
  int64_t repeats = 0;
  for (int row = 0; row < 1500; ++row) {
    const auto [k, S] = shapes[rng() % shapes.size()];
    const std::vector<int32_t> keys_of_row = RandomRow(k, S, rng);
    keys.StartRow(k, S);
    const int64_t got =
        keys.FirstRepeat(k, [&](int64_t j) { return keys_of_row[j]; });
    const int64_t want = FirstRepeatByHand(keys_of_row, S);
    ASSERT_EQ(got, want) << "row " << row << ", k " << k << ", S " << S;
    repeats += want >= 0;
  }
  // Both outcomes were seen many times.
  EXPECT_GT(repeats, 300);
  EXPECT_LT(repeats, 1200);
}

TEST(RowKeySet, ARowForgetsTheKeysOfTheRowsBefore) {
  // In both uses: one set of keys every 255th row and other keys between,
  // so that a key's mark is 255 rows old when it comes again (the marks'
  // stamps wrap there); and after Release.
  RowKeySet keys;
  for (const int64_t S : {int64_t{64}, int64_t{1} << 30}) {
    const std::vector<int32_t> sometimes = {3, 17, 0, 40, -1, 63};
    const std::vector<int32_t> between = {5, 6, -1, 7, 8, 9};
    for (int r = 0; r < 1200; ++r) {
      if (r == 1000) keys.Release();
      const std::vector<int32_t>& row = r % 255 == 0 ? sometimes : between;
      keys.StartRow(static_cast<int64_t>(row.size()), S);
      ASSERT_EQ(keys.FirstRepeat(static_cast<int64_t>(row.size()),
                                 [&](int64_t j) { return row[j]; }),
                -1)
          << "S " << S << ", row " << r;
    }
  }
}

}  // namespace
}  // namespace klserve
