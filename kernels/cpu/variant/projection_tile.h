#ifndef KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_TILE_H_
#define KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_TILE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/projection_tile.h"
#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/projections_problem.h"

namespace klserve::cpu::KLSERVE_ISA {

// Computes one tile (kernels/cpu/projection_tile.h) from the query rows in
// `data` into `outputs`. Errors
// are INVALID_ARGUMENT naming the tensor and the position; `failed_row` is
// then the row that failed.
absl::Status ComputeProjectionTile(const ProjectionsProblem& problem,
                                   const ProjectionsRowData& data,
                                   const ProjectionTile& tile,
                                   const ProjectionTileOutputs& outputs,
                                   int64_t& failed_row);

// MEAN_VALID's N without row_valid: how many of `rows` have a valid key (or,
// with the client's indices, a valid slot, whose indices it checks).
absl::Status CountRowsWithKeys(const ProjectionsProblem& problem,
                               const ProjectionsRowData& data, RowRange rows,
                               int64_t& count, int64_t& failed_row);

// The two stages' tiles (dense_projection_tile.cc,
// sparse_projection_tile.cc), which ComputeProjectionTile picks between.
absl::Status ComputeDenseProjectionTile(const ProjectionsProblem& problem,
                                        const ProjectionsRowData& data,
                                        const ProjectionTile& tile,
                                        const ProjectionTileOutputs& outputs,
                                        int64_t& failed_row);
absl::Status ComputeSparseProjectionTile(const ProjectionsProblem& problem,
                                         const ProjectionsRowData& data,
                                         const ProjectionTile& tile,
                                         const ProjectionTileOutputs& outputs,
                                         int64_t& failed_row);

// Frees what this thread's tiles kept for reuse: for when the thread has
// computed its last tile of a request.
void ReleaseProjectionScratch();

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_TILE_H_
