#ifndef KLSERVE_KERNELS_CPU_PROJECTION_TILE_MEMORY_H_
#define KLSERVE_KERNELS_CPU_PROJECTION_TILE_MEMORY_H_

#include <cstdint>

// What one compute thread holds while it computes a tile of the projections
// form: the rows per tile follow from it, and a request whose tile would
// need too much is refused before it computes (--max_thread_scratch_bytes).

namespace klserve::cpu {

// The sizes a tile's buffers grow with.
struct ProjectionTileShape {
  int64_t S = 0;  // keys of a batch entry
  int64_t K = 0;  // slots per row in the sparse stage; 0 in the dense stage
  bool server_topk = false;  // the sparse stage with the service's selection
  int64_t H = 0, H_kv = 0, D = 0;
  int64_t H_I = 0, D_I = 0;
};

// The most query rows of a tile: 128 dense (the matrix products near the
// BLAS's rate) or 16 sparse, fewer where the buffers that grow with the
// rows ([rows, S] floats in the dense stage) would pass kTileRowsBytes, and
// at least 1.
int64_t ProjectionTileRows(const ProjectionTileShape& shape);

// The buffers that grow with a tile's rows stay within this where one row's
// fit: with the benchmark's heads, 32 MiB holds 128 dense rows up to S of
// about 18K, 38 rows at S = 64K and one from S = 2^21 on.
inline constexpr int64_t kTileRowsBytes = int64_t{32} << 20;

// What one compute thread holds for a tile of `rows` query rows.
struct ProjectionTileScratch {
  // An upper bound: the tile's buffers, its d_index_key contribution (kept
  // until its turn to be folded), and the row code's scratch. Saturates at
  // INT64_MAX.
  int64_t bytes = 0;
  // The part of it that grows with the query rows' own widths (H * D,
  // H_I * D_I) rather than with S or K.
  int64_t query_side_bytes = 0;
};
ProjectionTileScratch ProjectionTileScratchOf(const ProjectionTileShape& shape,
                                              int64_t rows);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_PROJECTION_TILE_MEMORY_H_
