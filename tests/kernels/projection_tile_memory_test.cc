// The projections form's tile rows and per-thread scratch bound
// (kernels/cpu/projection_tile_memory.h): tiles take fewer rows as S grows,
// never fewer than one, and the bound grows with S and the head sizes and
// saturates rather than overflow.

#include "kernels/cpu/projection_tile_memory.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace klserve::cpu {
namespace {

// The benchmark's shape (bench/projections_bench.cc): H = 16, D = 128,
// H_I = 8, D_I = 64.
ProjectionTileShape Dense(int64_t S) {
  return {.S = S, .K = 0, .H = 16, .H_kv = 16, .D = 128, .H_I = 8, .D_I = 64};
}

TEST(ProjectionTileRows, DenseTilesShrinkAsSGrowsAndKeepAtLeastOneRow) {
  EXPECT_EQ(ProjectionTileRows(Dense(4096)), 128);
  EXPECT_EQ(ProjectionTileRows(Dense(16384)), 128);
  // 32 MiB over 13 bytes a key (w, I, g and a validity byte) plus the
  // exponentials of a key tile (8 x 512 floats) and the query side a row.
  EXPECT_EQ(ProjectionTileRows(Dense(65536)), 38);
  EXPECT_EQ(ProjectionTileRows(Dense(int64_t{1} << 21)), 1);
  EXPECT_EQ(ProjectionTileRows(Dense(int64_t{1} << 40)), 1);
  int64_t previous = 128;
  for (int64_t S = 1; S <= (int64_t{1} << 24); S *= 2) {
    const int64_t rows = ProjectionTileRows(Dense(S));
    EXPECT_GE(rows, 1) << S;
    EXPECT_LE(rows, previous) << S;
    // [rows, S] floats three times over: within the budget unless one
    // row alone is past it.
    if (rows > 1) {
      EXPECT_LE(rows * 12 * S, kTileRowsBytes) << S;
    }
    previous = rows;
  }
}

TEST(ProjectionTileRows, SparseTilesHaveAtMostSixteenRows) {
  ProjectionTileShape sparse = Dense(4096);
  sparse.K = 2048;
  EXPECT_EQ(ProjectionTileRows(sparse), 16);
  sparse.server_topk = true;
  EXPECT_EQ(ProjectionTileRows(sparse), 16);
  sparse.K = int64_t{1} << 22;  // each row's slots past the budget
  EXPECT_EQ(ProjectionTileRows(sparse), 1);
}

// A causal tile keeps its own key tiles' logits and dot products when they
// fit their budgets (32 and 16 MiB), though S's would not: the bound counts
// the budgets then, where it had counted one key tile's block.
TEST(ProjectionTileScratch, CountsTheKeptLogitsWhenSsWouldNotFit) {
  // 38 rows x 16 heads x 65536 keys x 4 bytes: 152 MiB, past 32 MiB.
  EXPECT_GE(ProjectionTileScratchOf(Dense(65536), 38).bytes,
            38 * 65536 * 13 + (int64_t{48} << 20));
}

TEST(ProjectionTileScratch, GrowsWithTheKeysAndTheHeads) {
  const int64_t small = ProjectionTileScratchOf(Dense(4096), 128).bytes;
  // The tile's [128, 4096] floats three times over, at least.
  EXPECT_GE(small, 128 * 4096 * 12);
  EXPECT_LT(small, int64_t{256} << 20);
  EXPECT_LT(small, ProjectionTileScratchOf(Dense(65536), 128).bytes);
  ProjectionTileShape wide = Dense(4096);
  wide.H = int64_t{1} << 20;
  const ProjectionTileScratch heads = ProjectionTileScratchOf(wide, 1);
  EXPECT_GT(heads.bytes, small);
  // The query rows' widths make most of it: what names `query`.
  EXPECT_GT(2 * heads.query_side_bytes, heads.bytes);
  EXPECT_LT(
      2 * ProjectionTileScratchOf(Dense(int64_t{1} << 21), 1).query_side_bytes,
      ProjectionTileScratchOf(Dense(int64_t{1} << 21), 1).bytes);
}

TEST(ProjectionTileScratch, SaturatesInsteadOfOverflowing) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ProjectionTileScratchOf(Dense(int64_t{1} << 62), 1).bytes, kMax);
  ProjectionTileShape heads = Dense(4096);
  heads.H = heads.D = int64_t{1} << 40;
  EXPECT_EQ(ProjectionTileScratchOf(heads, 128).bytes, kMax);
  ProjectionTileShape slots = Dense(4096);
  slots.K = int64_t{1} << 50;
  slots.D_I = int64_t{1} << 20;
  EXPECT_EQ(ProjectionTileScratchOf(slots, 16).bytes, kMax);
}

}  // namespace
}  // namespace klserve::cpu
