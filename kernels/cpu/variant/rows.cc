// The entry point of each ISA variant: the rows of one chunk, and the
// variant's dispatch table.

#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/variant/projection_tile.h"
#include "kernels/cpu/variant/row_convert.h"
#include "kernels/cpu/variant/row_loss.h"
#include "kernels/cpu/variant/row_passes.h"
#include "kernels/cpu/variant/row_validity.h"
#include "kernels/row_rules.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

std::byte* GradRow(const BlockOutputs& out, int64_t r, int64_t T) {
  const int64_t offset =
      StridedRowOffset(r, /*h=*/0, T, out.grad_origin_row,
                       out.grad_batch_stride, out.grad_row_stride,
                       /*head_stride=*/0);
  return out.grad + offset * DTypeSize(out.grad_dtype);
}

// Row r + 1's target, scores and indices, to be fetched while row r
// computes.
Prefetcher NextRow(const IndexerKlProblem& p, const RowData& data, int64_t r) {
  const bool sparse = data.indices.present();
  return Prefetcher(
      data.target.Row(r + 1, p.T), data.scores.Row(r + 1, p.T),
      sparse ? data.indices.Row(r + 1, p.T) : nullptr,
      p.row_length *
          std::max({DTypeSize(data.target.dtype), DTypeSize(data.scores.dtype),
                    sparse ? DTypeSize(DType::kInt32) : int64_t{0}}));
}

absl::StatusOr<RowResult> ComputeRow(const IndexerKlProblem& p,
                                     const RowData& data, int64_t r,
                                     const BlockOutputs& out, Prefetcher& next,
                                     RowScratch& scratch) {
  absl::StatusOr<RowValidity> validity = BuildRowValidity(p, data, r, scratch);
  if (!validity.ok()) return validity.status();

  std::byte* grad_out = out.grad != nullptr ? GradRow(out, r, p.T) : nullptr;
  const bool counts = p.row_counts(r);
  float* grad = nullptr;
  if (grad_out != nullptr && counts) {
    grad = IsDirectFloat(out.grad_dtype, grad_out)
               ? reinterpret_cast<float*>(grad_out)
               : scratch.grad();
  }
  absl::StatusOr<RowResult> result = ComputeRowLoss(
      p, data, r, *validity, static_cast<float>(out.grad_scale), grad,
      grad == reinterpret_cast<float*>(grad_out), next, scratch);
  if (!result.ok()) return result;
  if (grad_out != nullptr) {
    if (!counts) {
      // row_valid false: no gradient under any reduction (all-zero bits in
      // every float dtype).
      std::memset(grad_out, 0, p.row_length * DTypeSize(out.grad_dtype));
    } else if (grad != reinterpret_cast<float*>(grad_out)) {
      StoreFloatRow(grad, p.row_length, out.grad_dtype, grad_out);
    }
  }
  return result;
}

absl::Status ComputeRows(const IndexerKlProblem& p, const RowData& data,
                         RowRange rows, const BlockOutputs& out,
                         RowResult* results, int64_t& failed_row) {
  RowScratch& scratch = RowScratch::ForThisThread(p);
  absl::Status status;
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    Prefetcher next = r + 1 < rows.end ? NextRow(p, data, r) : Prefetcher();
    absl::StatusOr<RowResult> result =
        ComputeRow(p, data, r, out, next, scratch);
    if (!result.ok()) {
      failed_row = r;
      status = result.status();
      break;
    }
    results[r - rows.begin] = *result;
  }
  FinishStreamingStores();
  return status;
}

void ExpArray(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) Store(out + i, Exp(Load(in + i)));
}

}  // namespace

extern const IsaKernels kIsaKernels;
const IsaKernels kIsaKernels = {Isa::KLSERVE_ISA_ENUM,
                                &ComputeRows,
                                &ExpArray,
                                &ComputeProjectionTile,
                                &ReleaseProjectionScratch,
                                &CountRowsWithKeys};

}  // namespace klserve::cpu::KLSERVE_ISA
