#ifndef KLSERVE_KERNELS_CUDA_COPY_PLAN_H_
#define KLSERVE_KERNELS_CUDA_COPY_PLAN_H_

// How the CUDA backend moves a block of rows between the caller's host
// tensors (any RowView layout) and the packed chunks the device computes on.
// Plain C++ (no CUDA), so that it can be tested anywhere.

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/problem.h"
#include "kernels/row_rules.h"

namespace klserve::cuda {

// Where a tensor's rows lie in host memory: element (r, h, j) is at byte
// ((r / T - b0) * batch_stride + (r % T - t0) * row_stride + h * head_stride
//  + j) * element_size, with (b0, t0) = row origin_row (RowView's rule).
struct StridedRows {
  int64_t element_size = 0;
  int64_t origin_row = 0;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;

  // Byte offset of row r's first element of head h.
  int64_t Offset(int64_t r, int64_t T, int64_t h) const {
    return StridedRowOffset(r, h, T, origin_row, batch_stride, row_stride,
                            head_stride) *
           element_size;
  }
};

StridedRows LayoutOf(const RowView& view);
StridedRows GradLayoutOf(const BlockOutputs& outputs);

// One contiguous copy between the strided tensor (byte offset `strided`
// from its base) and the packed buffer (byte offset `packed`).
struct RowCopy {
  int64_t strided = 0;
  int64_t packed = 0;
  int64_t bytes = 0;
};

// The copies that move rows `rows`, each `heads` heads of `width` elements,
// between `layout` and the packed layout [heads, n, width], in packed order.
// Rows that follow each other in memory merge into one copy: a whole tensor
// or a block of rows is one copy per head (or one in all), other views one
// per row.
std::vector<RowCopy> PlanRowCopies(const StridedRows& layout, int64_t T,
                                   RowRange rows, int64_t heads, int64_t width);

// Byte offsets of the packed inputs of a chunk of n rows in one buffer, each
// 256-byte aligned: the target [H, n, K], the scores [n, K], the indices
// [n, K] (sparse stage) and the attention_mask rows [n, S] (when given);
// absent tensors take no bytes.
struct ChunkInputs {
  int64_t target = 0;
  int64_t scores = 0;
  int64_t indices = 0;
  int64_t mask = 0;
  int64_t bytes = 0;
};
ChunkInputs LayoutChunkInputs(const IndexerKlProblem& problem,
                              const RowData& data, int64_t n);

// Byte offsets of a chunk's outputs: n DeviceRowResults, then the gradient
// [n, K] in grad_dtype when `with_grad`.
struct ChunkOutputs {
  int64_t results = 0;
  int64_t grad = 0;
  int64_t bytes = 0;
};
ChunkOutputs LayoutChunkOutputs(const IndexerKlProblem& problem, bool with_grad,
                                DType grad_dtype, int64_t n);

// Byte offsets of the device scratch of a chunk: validity bytes [n, K] (when
// the rows have a mask or indices) and the per-head target weights [n, K]
// (float, per-head logits only).
struct ChunkScratch {
  int64_t valid = 0;
  int64_t w = 0;
  int64_t bytes = 0;
  bool has_valid = false;
  bool has_w = false;
};
ChunkScratch LayoutChunkScratch(const IndexerKlProblem& problem, int64_t n);

// Rows per chunk: as many as keep `bytes(rows)` within `budget`, at least
// one, at most n. `bytes` must grow with its argument.
template <typename BytesOf>
int64_t RowsPerChunk(BytesOf bytes, int64_t budget, int64_t n) {
  int64_t lo = 1, hi = n;  // bytes(lo) may exceed budget: one row at least
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (bytes(mid) <= budget) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_COPY_PLAN_H_
