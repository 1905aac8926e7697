#include "kernels/problem.h"

#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

// Keys must be addressable by INT32 indices.
constexpr int64_t kMaxKeys = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxQOffset = int64_t{1} << 62;

std::string ShapeString(absl::Span<const int64_t> shape) {
  // A message quotes a few dimensions, not a whole hostile shape.
  constexpr size_t kMaxQuoted = 8;
  if (shape.size() <= kMaxQuoted) {
    return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  }
  return absl::StrCat("[", absl::StrJoin(shape.first(kMaxQuoted), ", "),
                      ", ...] (", shape.size(), " dimensions)");
}

absl::Status Invalid(absl::string_view field, absl::string_view rule,
                     absl::string_view got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", rule, ", got ", got));
}

absl::Status CheckDType(absl::string_view field, const TensorView& view,
                        std::initializer_list<DType> allowed) {
  for (DType dtype : allowed) {
    if (view.dtype == dtype) return absl::OkStatus();
  }
  std::string names;
  for (DType dtype : allowed) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", DTypeName(dtype));
  }
  return Invalid(field, absl::StrCat("dtype must be one of ", names),
                 DTypeName(view.dtype));
}

// Rank, positive dims, no overflow, and, when the bytes come with the view
// (`with_data`), a byte size matching the shape.
absl::Status CheckLayout(absl::string_view field, const TensorView& view,
                         absl::string_view layout, size_t rank,
                         bool with_data = true) {
  if (view.shape.size() != rank) {
    return Invalid(field, absl::StrCat("shape must be ", layout),
                   ShapeString(view.shape));
  }
  int64_t bytes = DTypeSize(view.dtype);
  for (int64_t dim : view.shape) {
    if (dim <= 0) {
      return Invalid(
          field,
          absl::StrCat("every dimension of ", layout, " must be positive"),
          ShapeString(view.shape));
    }
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return Invalid(field, "the shape's byte size must fit in 64 bits",
                     ShapeString(view.shape));
    }
  }
  if (!with_data) return absl::OkStatus();
  if (view.byte_size != bytes) {
    return Invalid(
        field,
        absl::StrCat("byte size must be ", bytes, " for shape ",
                     ShapeString(view.shape), " of ", DTypeName(view.dtype)),
        absl::StrCat(view.byte_size));
  }
  if (view.data == nullptr) {
    return Invalid(field, "data must be present", "none");
  }
  return absl::OkStatus();
}

// Checks a tensor whose shape the problem already fixes.
absl::Status CheckTensor(absl::string_view field, const TensorView& view,
                         std::initializer_list<DType> allowed,
                         absl::string_view layout,
                         std::initializer_list<int64_t> expected,
                         bool with_data = true) {
  RETURN_IF_ERROR(CheckDType(field, view, allowed));
  RETURN_IF_ERROR(CheckLayout(field, view, layout, expected.size(), with_data));
  if (!std::equal(expected.begin(), expected.end(), view.shape.begin())) {
    return Invalid(
        field,
        absl::StrCat("shape must be ", layout, " = ", ShapeString(expected)),
        ShapeString(view.shape));
  }
  return absl::OkStatus();
}

constexpr std::initializer_list<DType> kFloatTypes = {
    DType::kFloat32, DType::kBFloat16, DType::kFloat16};

RowView RowsOf(const TensorView& view, int64_t T, int64_t n, int64_t H) {
  RowView rows;
  rows.dtype = view.dtype;
  rows.data = static_cast<const std::byte*>(view.data);
  rows.batch_stride = H * T * n;
  rows.row_stride = n;
  rows.head_stride = T * n;
  return rows;
}

absl::Status CheckOptions(const IndexerKlOptions& options) {
  if (!std::isfinite(options.softmax_scale) || options.softmax_scale <= 0) {
    return Invalid("softmax_scale", "must be finite and positive",
                   absl::StrCat(options.softmax_scale));
  }
  // Every gradient entry is at most |c| / N in magnitude (N >= 1): with
  // |c| no larger than the largest FP16, it is finite in every grad dtype.
  constexpr double kMaxScalingFactor = 65504;
  if (!(std::abs(options.scaling_factor) <= kMaxScalingFactor)) {
    return Invalid(
        "scaling_factor",
        absl::StrCat("must be finite with |c| <= ", kMaxScalingFactor,
                     " (the gradient must be finite in FP16)"),
        absl::StrCat(options.scaling_factor));
  }
  if (options.recall_k < 0) {
    return Invalid("recall_k", "must be >= 0", absl::StrCat(options.recall_k));
  }
  if (options.want_grad && !IsFloatDType(options.grad_dtype)) {
    return Invalid("grad_dtype", "must be FP32, BF16 or FP16",
                   DTypeName(options.grad_dtype));
  }
  if (options.q_offset &&
      (*options.q_offset > kMaxQOffset || *options.q_offset < -kMaxQOffset)) {
    return Invalid("q_offset", "must be within +-2^62",
                   absl::StrCat(*options.q_offset));
  }
  return absl::OkStatus();
}

// The scores fix the form's stage, B, T, the row length and S.
absl::Status TakeScores(const IndexerKlInputs& in, bool whole,
                        IndexerKlProblem& p) {
  const TensorView& scores = in.indexer_scores;
  const bool sparse = in.topk_indices.has_value();
  const char* layout = sparse ? "[B, T, K]" : "[B, T, S]";
  RETURN_IF_ERROR(CheckDType("indexer_scores", scores, kFloatTypes));
  RETURN_IF_ERROR(CheckLayout("indexer_scores", scores, layout, 3, whole));
  p.B = scores.shape[0];
  p.T = scores.shape[1];
  p.row_length = scores.shape[2];
  const int64_t num_keys = p.options.num_keys;
  if (sparse) {
    if (num_keys <= 0) {
      return Invalid("num_keys", "must be given (S >= 1) in the sparse stage",
                     absl::StrCat(num_keys));
    }
    p.S = num_keys;
    RETURN_IF_ERROR(CheckTensor("topk_indices", *in.topk_indices,
                                {DType::kInt32}, "[B, T, K]",
                                {p.B, p.T, p.row_length}, whole));
    p.rows.indices = RowsOf(*in.topk_indices, p.T, p.row_length, 1);
  } else {
    p.S = p.row_length;
    if (num_keys != 0 && num_keys != p.S) {
      return Invalid("num_keys",
                     absl::StrCat("must be 0 or S = ", p.S,
                                  " (indexer_scores' last dimension) in the "
                                  "dense stage"),
                     absl::StrCat(num_keys));
    }
  }
  if (p.S > kMaxKeys) {
    return Invalid("num_keys", "S must be below 2^31", absl::StrCat(p.S));
  }
  p.rows.scores = RowsOf(scores, p.T, p.row_length, 1);
  return absl::OkStatus();
}

// The target: per-head logits (which fix H) or head-aggregated weights.
absl::Status TakeTarget(const IndexerKlInputs& in, bool whole,
                        IndexerKlProblem& p) {
  if (in.attention_logits.has_value() == in.attention_weights.has_value()) {
    return Invalid("attention_logits, attention_weights",
                   "exactly one target must be given",
                   in.attention_logits ? "both" : "neither");
  }
  p.form = MakeInputForm(in.topk_indices.has_value(),
                         in.attention_logits.has_value());
  if (p.per_head()) {
    const TensorView& logits = *in.attention_logits;
    const char* layout = p.sparse() ? "[B, H, T, K]" : "[B, H, T, S]";
    RETURN_IF_ERROR(CheckDType("attention_logits", logits, kFloatTypes));
    RETURN_IF_ERROR(CheckLayout("attention_logits", logits, layout, 4, whole));
    p.H = logits.shape[1];
    RETURN_IF_ERROR(CheckTensor("attention_logits", logits, kFloatTypes, layout,
                                {p.B, p.H, p.T, p.row_length}, whole));
    p.rows.target = RowsOf(logits, p.T, p.row_length, p.H);
  } else {
    p.H = 1;
    RETURN_IF_ERROR(CheckTensor("attention_weights", *in.attention_weights,
                                kFloatTypes,
                                p.sparse() ? "[B, T, K]" : "[B, T, S]",
                                {p.B, p.T, p.row_length}, whole));
    p.rows.target = RowsOf(*in.attention_weights, p.T, p.row_length, 1);
  }
  return absl::OkStatus();
}

// Which keys each query may see (segments, the explicit mask, key padding)
// and which rows count (row_valid).
absl::Status TakeMasks(const IndexerKlInputs& in, bool whole,
                       IndexerKlProblem& p) {
  if (in.segment_ids_q.has_value() != in.segment_ids_kv.has_value()) {
    return Invalid(in.segment_ids_q ? "segment_ids_kv" : "segment_ids_q",
                   "segment_ids_q and segment_ids_kv must be given together",
                   "only one");
  }
  if (in.segment_ids_q) {
    RETURN_IF_ERROR(CheckTensor("segment_ids_q", *in.segment_ids_q,
                                {DType::kInt32}, "[B, T]", {p.B, p.T}));
    RETURN_IF_ERROR(CheckTensor("segment_ids_kv", *in.segment_ids_kv,
                                {DType::kInt32}, "[B, S]", {p.B, p.S}));
    p.segment_ids_q = static_cast<const std::byte*>(in.segment_ids_q->data);
    p.segment_ids_kv = static_cast<const std::byte*>(in.segment_ids_kv->data);
  }
  if (in.attention_mask) {
    RETURN_IF_ERROR(CheckTensor("attention_mask", *in.attention_mask,
                                {DType::kBool}, "[B, T, S]", {p.B, p.T, p.S},
                                whole));
    p.has_attention_mask = true;
    p.rows.mask = RowsOf(*in.attention_mask, p.T, p.S, 1);
  }
  if (in.key_padding_mask) {
    RETURN_IF_ERROR(CheckTensor("key_padding_mask", *in.key_padding_mask,
                                {DType::kBool}, "[B, S]", {p.B, p.S}));
    p.key_padding_mask =
        static_cast<const std::byte*>(in.key_padding_mask->data);
  }
  if (in.row_valid) {
    RETURN_IF_ERROR(CheckTensor("row_valid", *in.row_valid, {DType::kBool},
                                "[B, T]", {p.B, p.T}));
    p.row_valid = static_cast<const std::byte*>(in.row_valid->data);
  }
  return absl::OkStatus();
}

// N of the spec's reductions, where it is known before computing.
std::optional<int64_t> KnownDenominator(const IndexerKlProblem& p) {
  switch (p.options.reduction) {
    case Reduction::kMean:
      return p.num_rows();
    case Reduction::kSum:
      return 1;
    case Reduction::kMeanValid:
      if (p.row_valid == nullptr) return std::nullopt;
      int64_t count = 0;
      for (int64_t r = 0; r < p.num_rows(); ++r) {
        count += p.row_valid[r] != std::byte{0};
      }
      return count;
  }
  return std::nullopt;
}

}  // namespace

const char* InputFormName(InputForm form) {
  switch (form) {
    case InputForm::kDensePerHead:
      return "dense_perhead";
    case InputForm::kDenseAggregated:
      return "dense_agg";
    case InputForm::kSparsePerHead:
      return "sparse_perhead";
    case InputForm::kSparseAggregated:
      return "sparse_agg";
  }
  return "unknown";
}

absl::StatusOr<IndexerKlProblem> IndexerKlProblem::Create(
    const IndexerKlInputs& in, const IndexerKlOptions& options,
    IndexerKlProblem::RowTensors row_tensors) {
  RETURN_IF_ERROR(CheckOptions(options));
  IndexerKlProblem p;
  p.options = options;
  // In blocks, the per-row tensors give their dtype and shape only.
  const bool whole = row_tensors == IndexerKlProblem::RowTensors::kWhole;
  RETURN_IF_ERROR(TakeScores(in, whole, p));
  RETURN_IF_ERROR(TakeTarget(in, whole, p));
  RETURN_IF_ERROR(TakeMasks(in, whole, p));
  p.q_offset = options.q_offset.value_or(p.S - p.T);
  p.denominator = KnownDenominator(p);
  return p;
}

}  // namespace klserve
