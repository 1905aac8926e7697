#ifndef KLSERVE_KERNELS_PROBLEM_H_
#define KLSERVE_KERNELS_PROBLEM_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/row_rules.h"
#include "kernels/tensor_view.h"

// The indexer KL problem of docs/spec.md: what a caller sends,
// and the validated description every backend computes from.
//
// Letters follow the spec: B batch, T query rows, S keys, H main heads, K
// top-k slots. A row is one (b, t); rows are numbered r = b * T + t.

namespace klserve {

// Consecutive rows [begin, end).
struct RowRange {
  int64_t begin = 0;  // global row index b * T + t
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

enum class Flavor : uint8_t { kExact, kMaxText };
enum class Reduction : uint8_t { kMean, kMeanValid, kSum };

// What the request's target and scores are: the main attention's per-head
// logits or its head-aggregated weights, each over all S keys (the dense
// stage) or over K top-k slots per row (the sparse stage).
enum class InputForm : uint8_t {
  kDensePerHead,
  kDenseAggregated,
  kSparsePerHead,
  kSparseAggregated,
};

constexpr bool IsSparse(InputForm form) {
  return form == InputForm::kSparsePerHead ||
         form == InputForm::kSparseAggregated;
}
constexpr bool IsPerHead(InputForm form) {
  return form == InputForm::kDensePerHead || form == InputForm::kSparsePerHead;
}
constexpr InputForm MakeInputForm(bool sparse, bool per_head) {
  if (sparse) {
    return per_head ? InputForm::kSparsePerHead : InputForm::kSparseAggregated;
  }
  return per_head ? InputForm::kDensePerHead : InputForm::kDenseAggregated;
}
// "dense_perhead", "dense_agg", "sparse_perhead", "sparse_agg".
const char* InputFormName(InputForm form);

// The tensors of one request. Exactly one of `attention_logits` and
// `attention_weights` gives the target; `topk_indices` selects the sparse
// stage, in which every per-row tensor has K slots where the dense stage has
// S keys.
struct IndexerKlInputs {
  // Per-head main-attention logits [B,H,T,S] (sparse: [B,H,T,K]); FP32, BF16
  // or FP16. -inf means probability 0.
  std::optional<TensorView> attention_logits;
  // Head-aggregated target [B,T,S] (sparse: [B,T,K]), entries >= 0.
  std::optional<TensorView> attention_weights;
  // Lightning-indexer scores [B,T,S] (sparse: [B,T,K]).
  TensorView indexer_scores;
  // Top-k key indices [B,T,K], INT32; an index outside [0, S), usually -1,
  // marks an empty slot.
  std::optional<TensorView> topk_indices;
  // Packed segments: [B,T] and [B,S], INT32, both or neither.
  std::optional<TensorView> segment_ids_q;
  std::optional<TensorView> segment_ids_kv;
  // Explicit mask [B,T,S], BOOL, true = query t may look at key s.
  std::optional<TensorView> attention_mask;
  // Key padding [B,S], BOOL, true = key s may be attended.
  std::optional<TensorView> key_padding_mask;
  // [B,T], BOOL: rows that count (see the spec's reductions).
  std::optional<TensorView> row_valid;
  // Per-row key bounds [B,T], INT32, both or neither: key s is valid for row
  // (b, t) only if key_start <= s < key_end.
  std::optional<TensorView> key_start;
  std::optional<TensorView> key_end;
};

struct IndexerKlOptions {
  bool causal = false;
  // Query t sits at position t + q_offset; defaults to S - T.
  std::optional<int64_t> q_offset;
  // S. Required in the sparse stage (the scores then have K slots, not S
  // keys); in the dense stage 0 or equal to the scores' last dimension.
  int64_t num_keys = 0;
  // Multiplies the per-head logits before their softmax; finite and > 0.
  float softmax_scale = 1.0f;
  Flavor flavor = Flavor::kExact;
  Reduction reduction = Reduction::kMean;
  // c: the loss and the gradient are multiplied by it. Finite, at most the
  // largest float32 in magnitude, so that the loss is finite.
  double scaling_factor = 1.0;
  // Multiplies the gradient only (an upstream factor of the job's backward
  // pass). Finite, with |c / N * grad_scale| at most grad_dtype's largest
  // finite value (CheckGradScale), so that the gradient is finite.
  double grad_scale = 1.0;
  bool want_grad = true;
  DType grad_dtype = DType::kFloat32;  // FP32, BF16 or FP16
  bool want_row_kl = false;
  bool want_diagnostics = false;
  // Top-k recall diagnostic: the k of "target mass on the k keys with the
  // highest indexer scores". 0 leaves it out; otherwise >= 1.
  int64_t recall_k = 0;
};

// Where row r's elements of one per-row tensor live. Element (b, t, h, j) is
// at data + ((b - b0) * batch_stride + (t - t0) * row_stride
//            + h * head_stride + j) * DTypeSize(dtype),
// where (b0, t0) is row `origin_row`. A whole [B,H,T,S] tensor has origin 0,
// batch_stride H*T*S, row_stride S, head_stride T*S; a block of n consecutive
// rows laid out [H, n, S] has origin at its first row, batch_stride T*S,
// row_stride S and head_stride n*S. Strides count elements.
struct RowView {
  DType dtype = DType::kFloat32;
  const std::byte* data = nullptr;
  int64_t origin_row = 0;
  int64_t batch_stride = 0;
  int64_t row_stride = 0;
  int64_t head_stride = 0;

  bool present() const { return data != nullptr; }
  // Address of row r's first element of head h; T is the problem's T.
  const std::byte* Row(int64_t r, int64_t T, int64_t h = 0) const {
    return data + StridedRowOffset(r, h, T, origin_row, batch_stride,
                                   row_stride, head_stride) *
                      DTypeSize(dtype);
  }
};

// The large per-row tensors of a problem, or of a block of its rows.
struct RowData {
  RowView target;   // attention_logits or attention_weights
  RowView scores;   // indexer_scores
  RowView indices;  // topk_indices (sparse stage only)
  RowView mask;     // attention_mask, if given
};

// What sets the dimensions that the other tensors' shapes follow, as their
// errors name it: in the logits form, indexer_scores' shape (B, T, the row
// length, and S in the dense stage) and num_keys (S in the sparse stage); in
// the projections form, the client's query (B, T) and key (S).
struct ShapeSources {
  absl::string_view rows = "indexer_scores' shape";
  absl::string_view dense_keys;  // S in the dense stage; empty: `rows`
  absl::string_view sparse_keys = "num_keys";
};

// A validated problem. Only Create makes one, so every backend may rely on
// consistent shapes, byte sizes and options. Value rules that need a pass over
// the data (NaN, infinities, index ranges, duplicate keys) are checked by the
// backends as they compute, in the same pass, and reported as the same
// INVALID_ARGUMENT errors.
//
// A problem carries none of the large per-row tensors (attention_logits or
// attention_weights, indexer_scores, topk_indices, attention_mask): they come
// as RowData, of the whole request (WholeRowData) or of a block of its rows
// (BlockRowData in kernels/row_block.h), so that one problem serves a unary
// request and a stream alike.
class IndexerKlProblem {
 public:
  // Checks options, the dtypes and shapes of every tensor, dimension
  // products and byte sizes. A per-row tensor's view may carry no bytes (a
  // stream header's): its rows are checked when they come. Errors are
  // INVALID_ARGUMENT with a message "<field>: <rule>, got <value>".
  static absl::StatusOr<IndexerKlProblem> Create(
      const IndexerKlInputs& inputs, const IndexerKlOptions& options,
      const ShapeSources& sources = {});

  int64_t B = 0, T = 0, S = 0, H = 0;
  // The length of every per-row tensor's row: S in the dense stage, K (the
  // top-k slots) in the sparse stage.
  int64_t row_length = 0;
  InputForm form = InputForm::kDenseAggregated;
  int64_t q_offset = 0;
  IndexerKlOptions options;

  // The small per-batch tensors, kept whole (INT32 / BOOL), or null.
  const std::byte* segment_ids_q = nullptr;     // [B,T]
  const std::byte* segment_ids_kv = nullptr;    // [B,S]
  const std::byte* key_padding_mask = nullptr;  // [B,S]
  const std::byte* row_valid = nullptr;         // [B,T]
  const std::byte* key_start = nullptr;         // [B,T], with key_end
  const std::byte* key_end = nullptr;           // [B,T]

  bool has_attention_mask = false;

  // The per-row tensors' dtypes.
  DType target_dtype = DType::kFloat32;  // attention_logits or _weights
  DType scores_dtype = DType::kFloat32;

  // N of the spec's reductions when it is known before computing: always,
  // except for MEAN_VALID without row_valid, where it is the number of rows
  // the computation finds to have a valid key and a positive target.
  std::optional<int64_t> denominator;

  bool sparse() const { return IsSparse(form); }
  // The target is attention_logits (per head), not attention_weights.
  bool per_head() const { return IsPerHead(form); }
  int64_t num_rows() const { return B * T; }
  // Whether row r counts in the loss: row_valid true, or absent.
  bool row_counts(int64_t r) const { return RowCounts(row_valid, r); }
  // Masks beyond the causal cut and the key bounds' end, which a row's
  // validity needs a byte per key for.
  bool has_row_mask() const {
    return segment_ids_q != nullptr || key_padding_mask != nullptr ||
           has_attention_mask;
  }

 private:
  IndexerKlProblem() = default;
};

// Every gradient entry is (c / N) * grad_scale times a value of magnitude at
// most 1, so that factor must be finite in grad_dtype (INVALID_ARGUMENT
// naming grad_scale otherwise). Checked as soon as N is known: when the
// problem is made, or after a counting pass.
absl::Status CheckGradScale(const IndexerKlProblem& problem,
                            int64_t denominator);
// The gradient's scale c / N * grad_scale (0 when N = 0).
double GradScale(const IndexerKlProblem& problem, int64_t denominator);

// All rows of a whole per-row tensor [B, heads, T, width] (heads = 1:
// [B, T, width]) as a RowView.
RowView WholeRows(const TensorView& view, int64_t T, int64_t width,
                  int64_t heads);

// The views of all rows of the per-row tensors in `inputs`, the inputs
// `problem` was created from, after checking that each holds its bytes
// (INVALID_ARGUMENT naming the tensor otherwise).
absl::StatusOr<RowData> WholeRowData(const IndexerKlProblem& problem,
                                     const IndexerKlInputs& inputs);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_PROBLEM_H_
