#ifndef KLSERVE_KERNELS_CPU_PROJECTION_TILE_H_
#define KLSERVE_KERNELS_CPU_PROJECTION_TILE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/key_grad_fold.h"
#include "kernels/loss_accumulator.h"
#include "kernels/stop_check.h"

// One tile of the projections form's work (ProjectionsProblem::TileOf):
// consecutive query rows of one batch entry, against every key they may
// see.

namespace klserve::cpu {

// Keys per step of the dense tile's passes over the keys.
inline constexpr int64_t kKeyTile = 512;
// The keys a step's buffers make room for in a problem of S keys: kKeyTile,
// or S when fewer. The tiles size their buffers by it and their memory bound
// (ProjectionTileScratchOf) counts them by it, so the bound holds for any S.
constexpr int64_t KeyTileWidth(int64_t S) { return std::min(kKeyTile, S); }
// The most a dense tile keeps of its main logits between its two passes
// over them (docs/PERFORMANCE.md: the working memory).
inline constexpr int64_t kStoredLogitsBytes = int64_t{32} << 20;
// The same for the indexer's dot products, between the scores' pass and the
// gradients'.
inline constexpr int64_t kStoredDotsBytes = int64_t{16} << 20;

struct ProjectionTile {
  int64_t b = 0;  // batch entry
  int64_t t_begin = 0, t_end = 0;
  // c / N * grad_scale (0 when N = 0): the scale of dL/dI.
  double grad_scale = 0;
  bool want_grad = false;
  // Asked between the tile's steps (ProjectionSteps); null: never stops.
  const StopCheck* stop = nullptr;
};

// Where a tile writes: its rows' results, and its rows of the outputs that
// are per query row (buffers of rows from `origin_row` on; null when not
// asked for).
struct ProjectionTileOutputs {
  RowResult* results = nullptr;  // [t_end - t_begin]
  int64_t origin_row = 0;
  std::byte* d_index_query = nullptr;
  std::byte* d_index_weights = nullptr;
  DType grad_dtype = DType::kFloat32;
  int32_t* topk_indices = nullptr;  // the service's selection
  KeyGradPartial* key_grad = nullptr;
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_PROJECTION_TILE_H_
