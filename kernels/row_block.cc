#include "kernels/row_block.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

// A block tensor's view after checking its byte count. `heads` and `width`
// give its layout [heads, n, width]; `used` says whether the problem uses it.
absl::StatusOr<RowView> BlockView(absl::string_view field, RowRange rows,
                                  int64_t T, bool used, DType dtype,
                                  int64_t heads, int64_t width,
                                  const void* data, int64_t byte_size) {
  const int64_t n = rows.size();
  const int64_t expected = used ? heads * n * width * DTypeSize(dtype) : 0;
  if (byte_size != expected || (expected > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the block of rows [", rows.begin, ", ", rows.end,
        ") must hold ", expected, " bytes",
        used ? absl::StrCat(" ([", heads > 1 ? absl::StrCat(heads, ", ") : "",
                            n, ", ", width, "] ", DTypeName(dtype), ")")
             : " (the problem does not use it)",
        ", got ", byte_size));
  }
  RowView view;
  view.dtype = dtype;
  // An unused tensor stays absent even when the caller's pointer is not null
  // (an empty string's data()): a present view would be read as data.
  view.data = used ? static_cast<const std::byte*>(data) : nullptr;
  view.origin_row = rows.begin;
  // Rows are contiguous whatever batch they belong to: (b - b0) * T * width
  // + (t - t0) * width = (r - r0) * width.
  view.batch_stride = T * width;
  view.row_stride = width;
  view.head_stride = n * width;
  return view;
}

}  // namespace

absl::StatusOr<RowData> BlockRowData(const IndexerKlProblem& p, RowRange rows,
                                     const RowBlockBytes& bytes) {
  if (rows.begin < 0 || rows.size() < 1 || rows.end > p.num_rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_begin, num_rows: a block must hold rows within [0, B*T=",
        p.num_rows(), "), got [", rows.begin, ", ", rows.end, ")"));
  }
  RowData data;
  ASSIGN_OR_RETURN(
      data.target,
      BlockView(p.per_head() ? "attention_logits" : "attention_weights", rows,
                p.T, true, p.rows.target.dtype, p.H, p.row_length, bytes.target,
                bytes.target_bytes));
  ASSIGN_OR_RETURN(data.scores, BlockView("indexer_scores", rows, p.T, true,
                                          p.rows.scores.dtype, 1, p.row_length,
                                          bytes.scores, bytes.scores_bytes));
  ASSIGN_OR_RETURN(
      data.indices,
      BlockView("topk_indices", rows, p.T, p.sparse(), DType::kInt32, 1,
                p.row_length, bytes.indices, bytes.indices_bytes));
  ASSIGN_OR_RETURN(
      data.mask, BlockView("attention_mask", rows, p.T, p.has_attention_mask,
                           DType::kBool, 1, p.S, bytes.mask, bytes.mask_bytes));
  return data;
}

}  // namespace klserve
