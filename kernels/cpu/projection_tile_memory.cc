#include "kernels/cpu/projection_tile_memory.h"

#include <algorithm>
#include <limits>

#include "kernels/cpu/projection_tile.h"
#include "kernels/cpu/row_scratch.h"

namespace klserve::cpu {
namespace {

constexpr int64_t kFloat = sizeof(float);

// Sums and products of sizes that saturate at INT64_MAX, as a bound may.
class Bytes {
 public:
  Bytes& Add(int64_t a) {
    if (__builtin_add_overflow(total_, a, &total_)) total_ = kMax;
    return *this;
  }
  // Adds the product of the factors.
  template <typename... F>
  Bytes& AddProduct(int64_t first, F... rest) {
    int64_t product = first;
    for (const int64_t f : {rest...}) {
      if (__builtin_mul_overflow(product, f, &product)) return Add(kMax);
    }
    return Add(product);
  }
  int64_t total() const { return total_; }

 private:
  static constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t total_ = 0;
};

// RowScratch::BytesFor, saturated: past 2^40 slots no request fits anyway,
// and the product could overflow.
int64_t RowScratchBytes(int64_t slots, bool sparse) {
  return slots < (int64_t{1} << 40) ? RowScratch::BytesFor(slots, sparse)
                                    : std::numeric_limits<int64_t>::max();
}

// The bytes a tile holds per query row that grow with the row's own widths
// (H * D, H_I * D_I), not with the keys.
int64_t QueryRowBytes(const ProjectionTileShape& s) {
  Bytes b;
  // The row's converted query-side inputs.
  b.AddProduct(kFloat, s.H, s.D).AddProduct(kFloat, s.H_I, s.D_I + 1);
  // d_index_query and d_index_weights before they are stored.
  b.AddProduct(kFloat, s.H_I, s.D_I).AddProduct(8, s.H_I);
  // The dense heads' shift, scale, mass and sum.
  if (s.K == 0) b.AddProduct(24, s.H);
  return b.total();
}

// The bytes a tile holds per query row (they grow with the rows).
int64_t PerRowBytes(const ProjectionTileShape& s) {
  Bytes b;
  b.Add(QueryRowBytes(s));
  if (s.K == 0) {
    // w, I, g over the keys ([rows, S] each), and the keys' validity bytes;
    // the indexer gradient's exponentials of one key tile.
    b.AddProduct(3 * kFloat + 1, s.S)
        .AddProduct(kFloat, s.H_I, KeyTileWidth(s.S));
    // The float64 sums of the heads' blocks, over one key tile.
    if (s.H > kHeadsPerFloatSum) b.AddProduct(8, KeyTileWidth(s.S));
  } else {
    // The slots' keys, w, I and g, and their validity bytes; the indexer's
    // dot products u and the gathered index keys; the d_index_key
    // contributions of the slots.
    b.AddProduct(4 * kFloat + 1, s.K).AddProduct(kFloat, s.H_I, s.K);
    b.AddProduct(2 * kFloat, s.K, s.D_I).AddProduct(kFloat, s.K);
    if (s.server_topk) {
      // The dense scores the selection ranks and the keys' validity bytes,
      // and the selection itself.
      b.AddProduct(kFloat + 1, s.S)
          .AddProduct(kFloat, s.H_I, KeyTileWidth(s.S));
      b.AddProduct(kFloat, s.K);
    }
  }
  return b.total();
}

// The bytes a tile holds whatever its rows.
int64_t FixedBytes(const ProjectionTileShape& s) {
  Bytes b;
  // One key tile of key and index_key converted to float.
  b.AddProduct(kFloat, KeyTileWidth(s.S), s.H_kv, s.D)
      .AddProduct(kFloat, KeyTileWidth(s.S), s.D_I);
  if (s.K == 0) {
    // The d_index_key contributions of every key the tile sees; the row
    // code's scratch for rows of S slots.
    b.AddProduct(kFloat, s.S, s.D_I + 1);
    b.Add(RowScratchBytes(s.S, /*sparse=*/false));
  } else {
    // A row's gathered keys, logits and head weights; the row code's
    // scratch for rows of K slots (and of S for the selection's check).
    b.AddProduct(kFloat, s.K, s.D + s.H / std::max<int64_t>(s.H_kv, 1) + 3);
    if (s.H > kHeadsPerFloatSum) b.AddProduct(8, s.K);  // the heads' blocks
    b.AddProduct(kFloat, s.H_I + 1, s.K);
    b.Add(RowScratchBytes(s.K, /*sparse=*/true));
    if (s.server_topk) {
      b.AddProduct(8, s.S);  // the ranked keys of a row
      b.Add(RowScratchBytes(s.S, /*sparse=*/false));
    }
  }
  return b.total();
}

}  // namespace

int64_t ProjectionTileRows(const ProjectionTileShape& shape) {
  const int64_t most = shape.K == 0 ? 128 : 16;
  const int64_t per_row = std::max<int64_t>(PerRowBytes(shape), 1);
  return std::clamp<int64_t>(kTileRowsBytes / per_row, 1, most);
}

ProjectionTileScratch ProjectionTileScratchOf(const ProjectionTileShape& shape,
                                              int64_t rows) {
  Bytes b;
  b.AddProduct(PerRowBytes(shape), rows).Add(FixedBytes(shape));
  if (shape.K == 0) {
    // The main logits ([rows, key tile] per head) and the dot products
    // ([rows * H_I, key tile]) of every key tile, kept between passes when
    // they fit their budgets, else one block that each key tile overwrites
    // (KeyTileStore). A tile keeps its own key tiles, which may be fewer
    // than S's (a causal tile's keys end at its last row): when S's do not
    // fit, a tile's may still fill the budget.
    const int64_t key_tiles = (shape.S + kKeyTile - 1) / kKeyTile;
    const auto store = [&](int64_t slices, int64_t block_floats,
                           int64_t budget) {
      Bytes all, block;
      all.AddProduct(kFloat, key_tiles, slices, block_floats);
      block.AddProduct(kFloat, block_floats);
      return all.total() <= budget ? all.total()
                                   : std::max(block.total(), budget);
    };
    b.Add(store(shape.H, rows * KeyTileWidth(shape.S), kStoredLogitsBytes));
    b.Add(store(
        1, Bytes().AddProduct(rows, shape.H_I, KeyTileWidth(shape.S)).total(),
        kStoredDotsBytes));
  }
  return {.bytes = b.total(),
          .query_side_bytes =
              Bytes().AddProduct(QueryRowBytes(shape), rows).total()};
}

}  // namespace klserve::cpu
