#ifndef KLSERVE_KERNELS_CPU_ISA_KERNELS_H_
#define KLSERVE_KERNELS_CPU_ISA_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/projection_tile.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"

// The dispatch table: the entry points of the CPU backend's hot code, one
// table per ISA variant. The sources behind them (kernels/cpu/variant/) are
// compiled once per variant, each into its own namespace
// klserve::cpu::<variant>, so that no function compiled for one ISA can be
// linked in place of another's; everything else in the program is compiled
// for the baseline only.

namespace klserve::cpu {

struct IsaKernels {
  Isa isa;
  // Rows `rows` of `problem`: validity, loss and gradient of each, in row
  // order, with row r's result in results[r - rows.begin]. Stops at the
  // first row that fails, returns its error and sets `failed_row` to it.
  absl::Status (*compute_rows)(const IndexerKlProblem& problem,
                               const RowData& data, RowRange rows,
                               const BlockOutputs& outputs, RowResult* results,
                               int64_t& failed_row);
  // out[i] = exp(in[i]) by the kernels' own exp (in[i] <= 88, as a
  // softmax's x - max is), n a multiple of 16: the benchmark's compute
  // ceiling.
  void (*exp)(const float* in, float* out, int64_t n);
  // The projections form: one tile of query rows, and MEAN_VALID's count of
  // rows with a valid key (kernels/cpu/variant/projection_tile.h).
  absl::Status (*compute_projection_tile)(const ProjectionsProblem& problem,
                                          const ProjectionsRowData& data,
                                          const ProjectionTile& tile,
                                          const ProjectionTileOutputs& outputs,
                                          int64_t& failed_row);
  void (*release_projection_scratch)();
  absl::Status (*count_rows_with_keys)(const ProjectionsProblem& problem,
                                       const ProjectionsRowData& data,
                                       RowRange rows, int64_t& count,
                                       int64_t& failed_row);
};

// The table of `isa`, which the caller has checked the CPU runs (CpuRuns).
const IsaKernels& KernelsFor(Isa isa);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ISA_KERNELS_H_
