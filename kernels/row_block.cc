#include "kernels/row_block.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

// A block tensor's view after checking its byte count.
absl::StatusOr<RowView> BlockView(const BlockTensor& tensor, RowRange rows,
                                  int64_t T, const void* data,
                                  int64_t byte_size) {
  const int64_t n = rows.size();
  const int64_t expected = tensor.BytesOf(n);
  if (byte_size != expected || (expected > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        tensor.field, ": the block of rows [", rows.begin, ", ", rows.end,
        ") must hold ", expected, " bytes",
        tensor.used
            ? absl::StrCat(
                  " ([",
                  tensor.heads > 1 ? absl::StrCat(tensor.heads, ", ") : "", n,
                  ", ", tensor.width, "] ", DTypeName(tensor.dtype), ")")
            : " (the problem does not use it)",
        ", got ", byte_size));
  }
  RowView view;
  view.dtype = tensor.dtype;
  // An unused tensor stays absent even when the caller's pointer is not null
  // (an empty string's data()): a present view would be read as data.
  view.data = tensor.used ? static_cast<const std::byte*>(data) : nullptr;
  view.origin_row = rows.begin;
  // Rows are contiguous whatever batch they belong to: (b - b0) * T * width
  // + (t - t0) * width = (r - r0) * width.
  view.batch_stride = T * tensor.width;
  view.row_stride = tensor.width;
  view.head_stride = n * tensor.width;
  return view;
}

}  // namespace

std::array<BlockTensor, 4> BlockTensorsOf(const IndexerKlProblem& p) {
  return {{
      {p.per_head() ? "attention_logits" : "attention_weights", true,
       p.target_dtype, p.H, p.row_length},
      {"indexer_scores", true, p.scores_dtype, 1, p.row_length},
      {"topk_indices", p.sparse(), DType::kInt32, 1, p.row_length},
      {"attention_mask", p.has_attention_mask, DType::kBool, 1, p.S},
  }};
}

absl::StatusOr<RowData> BlockRowData(const IndexerKlProblem& p, RowRange rows,
                                     const RowBlockBytes& bytes) {
  if (rows.begin < 0 || rows.size() < 1 || rows.end > p.num_rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_begin, num_rows: a block must hold rows within [0, B*T=",
        p.num_rows(), "), got [", rows.begin, ", ", rows.end, ")"));
  }
  const auto [target, scores, indices, mask] = BlockTensorsOf(p);
  RowData data;
  ASSIGN_OR_RETURN(data.target, BlockView(target, rows, p.T, bytes.target,
                                          bytes.target_bytes));
  ASSIGN_OR_RETURN(data.scores, BlockView(scores, rows, p.T, bytes.scores,
                                          bytes.scores_bytes));
  ASSIGN_OR_RETURN(data.indices, BlockView(indices, rows, p.T, bytes.indices,
                                           bytes.indices_bytes));
  ASSIGN_OR_RETURN(data.mask,
                   BlockView(mask, rows, p.T, bytes.mask, bytes.mask_bytes));
  return data;
}

}  // namespace klserve
