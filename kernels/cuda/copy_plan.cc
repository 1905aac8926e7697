#include "kernels/cuda/copy_plan.h"

#include "kernels/cuda/device_row_result.h"

namespace klserve::cuda {
namespace {

constexpr int64_t kAlign = 256;

// Appends a region of `bytes` bytes at the next aligned offset of `end`.
int64_t Place(int64_t& end, int64_t bytes) {
  if (bytes == 0) return 0;
  const int64_t at = (end + kAlign - 1) / kAlign * kAlign;
  end = at + bytes;
  return at;
}

}  // namespace

StridedRows LayoutOf(const RowView& view) {
  return {DTypeSize(view.dtype), view.origin_row, view.batch_stride,
          view.row_stride, view.head_stride};
}

StridedRows GradLayoutOf(const BlockOutputs& outputs) {
  return {DTypeSize(outputs.grad_dtype), outputs.grad_origin_row,
          outputs.grad_batch_stride, outputs.grad_row_stride, 0};
}

std::vector<RowCopy> PlanRowCopies(const StridedRows& layout, int64_t T,
                                   RowRange rows, int64_t heads,
                                   int64_t width) {
  std::vector<RowCopy> copies;
  const int64_t n = rows.size();
  const int64_t row_bytes = width * layout.element_size;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t strided = layout.Offset(rows.begin + i, T, h);
      const int64_t packed = (h * n + i) * row_bytes;
      if (!copies.empty()) {
        RowCopy& last = copies.back();
        if (last.strided + last.bytes == strided &&
            last.packed + last.bytes == packed) {
          last.bytes += row_bytes;
          continue;
        }
      }
      copies.push_back({strided, packed, row_bytes});
    }
  }
  return copies;
}

ChunkInputs LayoutChunkInputs(const IndexerKlProblem& p, const RowData& data,
                              int64_t n) {
  ChunkInputs layout;
  int64_t end = 0;
  layout.target =
      Place(end, p.H * n * p.row_length * DTypeSize(data.target.dtype));
  layout.scores = Place(end, n * p.row_length * DTypeSize(data.scores.dtype));
  if (p.sparse()) layout.indices = Place(end, n * p.row_length * 4);
  if (data.mask.present()) layout.mask = Place(end, n * p.S);
  layout.bytes = end;
  return layout;
}

ChunkOutputs LayoutChunkOutputs(const IndexerKlProblem& p, bool with_grad,
                                DType grad_dtype, int64_t n) {
  ChunkOutputs layout;
  int64_t end = 0;
  layout.results =
      Place(end, n * static_cast<int64_t>(sizeof(DeviceRowResult)));
  if (with_grad)
    layout.grad = Place(end, n * p.row_length * DTypeSize(grad_dtype));
  layout.bytes = end;
  return layout;
}

ChunkScratch LayoutChunkScratch(const IndexerKlProblem& p, int64_t n) {
  ChunkScratch layout;
  int64_t end = 0;
  layout.has_valid = p.sparse() || p.has_row_mask();
  layout.has_w = p.per_head();
  if (layout.has_valid) layout.valid = Place(end, n * p.row_length);
  if (layout.has_w) layout.w = Place(end, n * p.row_length * 4);
  layout.bytes = end;
  return layout;
}

}  // namespace klserve::cuda
