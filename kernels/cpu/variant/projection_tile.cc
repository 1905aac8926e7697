// The projections form's entry points of each ISA variant.

#include "kernels/cpu/variant/projection_tile.h"

#include "absl/status/status.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/row_validity.h"
#include "kernels/problem.h"

namespace klserve::cpu::KLSERVE_ISA {

absl::Status CountRowsWithKeys(const ProjectionsProblem& problem,
                               const ProjectionsRowData& rows_data,
                               RowRange rows, int64_t& count,
                               int64_t& failed_row) {
  // With the service's selection a row has a valid slot iff it has a valid
  // key; with the client's indices, its slots decide (and are checked).
  const IndexerKlProblem& p =
      problem.server_topk ? *problem.selection : problem.logits;
  RowData data;
  data.mask = rows_data.mask;
  data.indices = rows_data.indices;
  RowScratch& scratch = RowScratch::ForThisThread(p);
  count = 0;
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    absl::StatusOr<RowValidity> v = BuildRowValidity(p, data, r, scratch);
    if (!v.ok()) {
      failed_row = r;
      return v.status();
    }
    count += v->count > 0;
  }
  return absl::OkStatus();
}

absl::Status ComputeProjectionTile(const ProjectionsProblem& problem,
                                   const ProjectionsRowData& data,
                                   const ProjectionTile& tile,
                                   const ProjectionTileOutputs& outputs,
                                   int64_t& failed_row) {
  return problem.sparse() ? ComputeSparseProjectionTile(problem, data, tile,
                                                        outputs, failed_row)
                          : ComputeDenseProjectionTile(problem, data, tile,
                                                       outputs, failed_row);
}

}  // namespace klserve::cpu::KLSERVE_ISA
