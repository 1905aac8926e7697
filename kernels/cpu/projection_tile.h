#ifndef KLSERVE_KERNELS_CPU_PROJECTION_TILE_H_
#define KLSERVE_KERNELS_CPU_PROJECTION_TILE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/loss_accumulator.h"

// One tile of the projections form's work: consecutive query rows of one
// batch entry, against every key they may see. Tiles are fixed by the
// problem alone (kDenseTileRows or kSparseTileRows rows from each batch
// entry's first row), so that what a tile computes never depends on the
// thread count.

namespace klserve::cpu {

// Query rows per tile. Dense: large enough that the tile's matrix products
// run near the BLAS's rate, small enough that its rows ([rows, S] floats,
// several of them) stay a few MiB. Sparse: each row gathers its own keys, so
// the tile only bounds the d_index_key contributions kept for the fold
// ([rows, K, D_I] floats).
inline constexpr int64_t kDenseTileRows = 128;
inline constexpr int64_t kSparseTileRows = 16;
// Keys per step of the dense tile's passes over the keys.
inline constexpr int64_t kKeyTile = 512;
// The most a dense tile keeps of its main logits between its two passes
// over them (docs/PERFORMANCE.md: the working memory).
inline constexpr int64_t kStoredLogitsBytes = int64_t{48} << 20;

struct ProjectionTile {
  int64_t b = 0;  // batch entry
  int64_t t_begin = 0, t_end = 0;
  // c / N * grad_scale (0 when N = 0): the scale of dL/dI.
  double grad_scale = 0;
  bool want_grad = false;
};

// A tile's contributions to d_index_key, kept until the tile's turn in the
// fold: row e (D_I floats at rows[e * D_I]) adds into key keys[e] of the
// tile's batch entry, in order of e.
struct KeyGradPartial {
  std::vector<float> rows;
  std::vector<int32_t> keys;
  int64_t count = 0;
};

// Where a tile writes: its rows' results, and its rows of the outputs that
// are per query row (whole tensors; null when not asked for).
struct ProjectionTileOutputs {
  RowResult* results = nullptr;  // [t_end - t_begin]
  std::byte* d_index_query = nullptr;
  std::byte* d_index_weights = nullptr;
  DType grad_dtype = DType::kFloat32;
  int32_t* topk_indices = nullptr;  // the service's selection, [B,T,K]
  KeyGradPartial* key_grad = nullptr;
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_PROJECTION_TILE_H_
