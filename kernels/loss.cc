#include "kernels/loss.h"

#include <algorithm>
#include <cstddef>

#include "kernels/status_macros.h"

namespace klserve {
namespace {

// The rows of one block: a block's per-row state (a RowResult, 40 bytes a
// row) is what a call holds beyond its tensors, so it stays at 2.5 MiB
// whatever B * T (a 16-million-row request through shared memory had taken
// 640 MiB). The bits do not depend on the block boundaries.
constexpr int64_t kRowsPerBlock = int64_t{1} << 16;

// One pass over the rows (the counting pass, or the loss's), in blocks.
absl::Status ComputePass(LossComputation& computation,
                         const IndexerKlProblem& problem, const RowData& rows,
                         const LossOutputs& outputs, bool counting) {
  const int64_t num_rows = problem.num_rows();
  const int64_t row_bytes =
      problem.row_length * DTypeSize(problem.options.grad_dtype);
  for (int64_t begin = 0; begin < num_rows; begin += kRowsPerBlock) {
    const int64_t n = std::min(kRowsPerBlock, num_rows - begin);
    ASSIGN_OR_RETURN(const AdmittedBlock block,
                     computation.Admit(begin, n, counting));
    LossOutputs block_outputs;
    if (outputs.grad != nullptr) {
      block_outputs.grad =
          static_cast<std::byte*>(outputs.grad) + begin * row_bytes;
      block_outputs.grad_byte_size = outputs.grad_byte_size - begin * row_bytes;
    }
    if (outputs.row_kl != nullptr) {
      block_outputs.row_kl = outputs.row_kl + begin;
      block_outputs.row_kl_size = outputs.row_kl_size - begin;
    }
    RETURN_IF_ERROR(computation.Compute(block, rows, block_outputs));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IndexerKlResult> ComputeIndexerKl(
    Backend& backend, const IndexerKlProblem& problem, const RowData& rows,
    const LossOutputs& outputs) {
  LossComputation computation(backend, problem);
  if (computation.needs_counting()) {
    RETURN_IF_ERROR(ComputePass(computation, problem, rows, LossOutputs(),
                                /*counting=*/true));
  }
  RETURN_IF_ERROR(
      ComputePass(computation, problem, rows, outputs, /*counting=*/false));
  return computation.Finish();
}

}  // namespace klserve
