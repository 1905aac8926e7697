#include "kernels/problem.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"
#include "kernels/tensor_checks.h"

namespace klserve {
namespace {

// Keys must be addressable by INT32 indices.
constexpr int64_t kMaxKeys = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxQOffset = int64_t{1} << 62;

absl::Status CheckOptions(const IndexerKlOptions& options) {
  if (!std::isfinite(options.softmax_scale) || options.softmax_scale <= 0) {
    return Invalid("softmax_scale", "must be finite and positive",
                   absl::StrCat(options.softmax_scale));
  }
  // Any finite c, as the contract puts it, short of what would take the
  // loss (c times a KL of float32 scores, at most about 2^130) past a
  // double: the largest float32 leaves it finite.
  constexpr double kMaxScalingFactor = std::numeric_limits<float>::max();
  if (!(std::abs(options.scaling_factor) <= kMaxScalingFactor)) {
    return Invalid("scaling_factor",
                   absl::StrCat("must be finite with |c| <= ",
                                absl::StrFormat("%.17g", kMaxScalingFactor),
                                " (the largest float32)"),
                   absl::StrFormat("%.17g", options.scaling_factor));
  }
  if (!std::isfinite(options.grad_scale)) {
    return Invalid("grad_scale", "must be finite",
                   absl::StrCat(options.grad_scale));
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

// Where a tensor's expected shape came from, for its error message
// (ShapeSources): `rows` for a shape of B, T and the row length, `keys` for
// one with S.
struct ShapeOrigins {
  std::string rows, keys;
};
ShapeOrigins OriginsOf(const ShapeSources& sources, bool sparse) {
  const absl::string_view keys =
      sparse ? sources.sparse_keys : sources.dense_keys;
  ShapeOrigins origins;
  origins.rows = absl::StrCat("from ", sources.rows);
  origins.keys =
      keys.empty() ? origins.rows
                   : absl::StrCat("S from ", keys, ", the rest ", origins.rows);
  return origins;
}

// The scores fix the form's stage, B, T, the row length and S.
absl::Status TakeScores(const IndexerKlInputs& in, const ShapeOrigins& origin,
                        IndexerKlProblem& p) {
  const TensorView& scores = in.indexer_scores;
  const bool sparse = in.topk_indices.has_value();
  const char* layout = sparse ? "[B, T, K]" : "[B, T, S]";
  RETURN_IF_ERROR(CheckDType("indexer_scores", scores, input_dtype::kScores));
  RETURN_IF_ERROR(CheckLayout("indexer_scores", scores, layout, 3));
  RETURN_IF_ERROR(CheckBytesIfAny("indexer_scores", scores));
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
                                input_dtype::kIndex, "[B, T, K]",
                                {p.B, p.T, p.row_length}, origin.rows));
    RETURN_IF_ERROR(CheckBytesIfAny("topk_indices", *in.topk_indices));
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
  p.scores_dtype = scores.dtype;
  return absl::OkStatus();
}

// The target: per-head logits (which fix H) or head-aggregated weights.
absl::Status TakeTarget(const IndexerKlInputs& in, const ShapeOrigins& origin,
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
    RETURN_IF_ERROR(
        CheckDType("attention_logits", logits, input_dtype::kScores));
    RETURN_IF_ERROR(CheckLayout("attention_logits", logits, layout, 4));
    p.H = logits.shape[1];
    RETURN_IF_ERROR(
        CheckTensor("attention_logits", logits, input_dtype::kScores, layout,
                    {p.B, p.H, p.T, p.row_length},
                    absl::StrCat("H from its own second dimension, the rest ",
                                 origin.rows)));
    RETURN_IF_ERROR(CheckBytesIfAny("attention_logits", logits));
    p.target_dtype = logits.dtype;
  } else {
    // Weights are probabilities already: a scale of the logits has nothing
    // to apply to, and a client that sends its 1 / sqrt(D) with them has
    // taken the weights for logits. 1 (a client's constant default) is
    // the same as none.
    if (p.options.softmax_scale != 1.0f) {
      return Invalid("softmax_scale",
                     "scales attention_logits, not attention_weights "
                     "(probabilities); leave it unset or 1",
                     absl::StrCat(p.options.softmax_scale));
    }
    p.H = 1;
    RETURN_IF_ERROR(CheckTensor("attention_weights", *in.attention_weights,
                                input_dtype::kScores,
                                p.sparse() ? "[B, T, K]" : "[B, T, S]",
                                {p.B, p.T, p.row_length}, origin.rows));
    RETURN_IF_ERROR(
        CheckBytesIfAny("attention_weights", *in.attention_weights));
    p.target_dtype = in.attention_weights->dtype;
  }
  return absl::OkStatus();
}

// Per-row key bounds: both or neither, INT32 [B, T], key_start >= 0 and
// key_end <= S. They are small, so their values are checked here rather
// than per row.
absl::Status TakeKeyBounds(const IndexerKlInputs& in,
                           const ShapeOrigins& origin, IndexerKlProblem& p) {
  if (in.key_start.has_value() != in.key_end.has_value()) {
    return Invalid(in.key_start ? "key_end" : "key_start",
                   "key_start and key_end must be given together", "only one");
  }
  if (!in.key_start) return absl::OkStatus();
  // The contract asks 0 <= key_start and key_end <= S, and nothing more: a
  // start at or past its end (past S, say, or an end below 0) leaves the
  // row no key, as the contract says of any such pair.
  struct Bound {
    const char* field;
    const TensorView* view;
    bool is_start;
  };
  for (const Bound& bound : {Bound{"key_start", &*in.key_start, true},
                             Bound{"key_end", &*in.key_end, false}}) {
    RETURN_IF_ERROR(CheckTensor(bound.field, *bound.view, input_dtype::kIndex,
                                "[B, T]", {p.B, p.T}, origin.rows));
    RETURN_IF_ERROR(CheckBytes(bound.field, *bound.view));
    const auto* bytes = static_cast<const std::byte*>(bound.view->data);
    for (int64_t r = 0; r < p.num_rows(); ++r) {
      const int32_t value = LoadInt32(bytes + 4 * r);
      if (bound.is_start ? value < 0 : value > p.S) {
        return absl::InvalidArgumentError(absl::StrCat(
            bound.field,
            bound.is_start ? ": must be >= 0, got "
                           : absl::StrCat(": must be <= S = ", p.S, ", got "),
            value, " at (b=", r / p.T, ", t=", r % p.T, ")"));
      }
    }
  }
  p.key_start = static_cast<const std::byte*>(in.key_start->data);
  p.key_end = static_cast<const std::byte*>(in.key_end->data);
  return absl::OkStatus();
}

// Which keys each query may see (segments, the explicit mask, key padding,
// key bounds) and which rows count (row_valid).
absl::Status TakeMasks(const IndexerKlInputs& in, const ShapeOrigins& origin,
                       IndexerKlProblem& p) {
  if (in.segment_ids_q.has_value() != in.segment_ids_kv.has_value()) {
    return Invalid(in.segment_ids_q ? "segment_ids_kv" : "segment_ids_q",
                   "segment_ids_q and segment_ids_kv must be given together",
                   "only one");
  }
  if (in.segment_ids_q) {
    RETURN_IF_ERROR(CheckTensor("segment_ids_q", *in.segment_ids_q,
                                input_dtype::kIndex, "[B, T]", {p.B, p.T},
                                origin.rows));
    RETURN_IF_ERROR(CheckBytes("segment_ids_q", *in.segment_ids_q));
    RETURN_IF_ERROR(CheckTensor("segment_ids_kv", *in.segment_ids_kv,
                                input_dtype::kIndex, "[B, S]", {p.B, p.S},
                                origin.keys));
    RETURN_IF_ERROR(CheckBytes("segment_ids_kv", *in.segment_ids_kv));
    p.segment_ids_q = static_cast<const std::byte*>(in.segment_ids_q->data);
    p.segment_ids_kv = static_cast<const std::byte*>(in.segment_ids_kv->data);
  }
  if (in.attention_mask) {
    RETURN_IF_ERROR(CheckTensor("attention_mask", *in.attention_mask,
                                input_dtype::kMask, "[B, T, S]",
                                {p.B, p.T, p.S}, origin.keys));
    RETURN_IF_ERROR(CheckBytesIfAny("attention_mask", *in.attention_mask));
    p.has_attention_mask = true;
  }
  if (in.key_padding_mask) {
    RETURN_IF_ERROR(CheckTensor("key_padding_mask", *in.key_padding_mask,
                                input_dtype::kMask, "[B, S]", {p.B, p.S},
                                origin.keys));
    RETURN_IF_ERROR(CheckBytes("key_padding_mask", *in.key_padding_mask));
    p.key_padding_mask =
        static_cast<const std::byte*>(in.key_padding_mask->data);
  }
  if (in.row_valid) {
    RETURN_IF_ERROR(CheckTensor("row_valid", *in.row_valid, input_dtype::kMask,
                                "[B, T]", {p.B, p.T}, origin.rows));
    RETURN_IF_ERROR(CheckBytes("row_valid", *in.row_valid));
    p.row_valid = static_cast<const std::byte*>(in.row_valid->data);
  }
  return TakeKeyBounds(in, origin, p);
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
    const ShapeSources& sources) {
  RETURN_IF_ERROR(CheckOptions(options));
  IndexerKlProblem p;
  p.options = options;
  const ShapeOrigins origin =
      OriginsOf(sources, /*sparse=*/in.topk_indices.has_value());
  RETURN_IF_ERROR(TakeScores(in, origin, p));
  RETURN_IF_ERROR(TakeTarget(in, origin, p));
  RETURN_IF_ERROR(TakeMasks(in, origin, p));
  p.q_offset = options.q_offset.value_or(p.S - p.T);
  p.denominator = KnownDenominator(p);
  if (p.denominator) RETURN_IF_ERROR(CheckGradScale(p, *p.denominator));
  return p;
}

absl::Status CheckGradScale(const IndexerKlProblem& problem,
                            int64_t denominator) {
  const IndexerKlOptions& options = problem.options;
  if (!options.want_grad || denominator == 0) return absl::OkStatus();
  const double factor = GradScale(problem, denominator);
  const double largest = LargestFinite(options.grad_dtype);
  // The rows take the factor as a float32 (GradScale's callers): that is
  // the value bounded, so a factor one double ulp past the bound from the
  // rounding of c / N (1 / 75 * 75 * 65504, say) still counts as on it.
  if (std::abs(factor) <= std::numeric_limits<float>::max() &&
      std::abs(static_cast<float>(factor)) <= largest) {
    return absl::OkStatus();
  }
  return Invalid(
      "grad_scale",
      absl::StrCat("|scaling_factor / N * grad_scale| must be at most ",
                   largest, ", the largest finite ",
                   DTypeName(options.grad_dtype),
                   " (every gradient entry is that factor times a value of "
                   "magnitude at most 1)"),
      // All 17 digits: a factor just past the bound must not print as the
      // bound.
      absl::StrFormat("%.17g / %d * %.17g = %.17g", options.scaling_factor,
                      denominator, options.grad_scale, factor));
}

double GradScale(const IndexerKlProblem& problem, int64_t denominator) {
  if (denominator == 0) return 0;
  return problem.options.scaling_factor / static_cast<double>(denominator) *
         problem.options.grad_scale;
}

RowView WholeRows(const TensorView& view, int64_t T, int64_t width,
                  int64_t heads) {
  RowView rows;
  rows.dtype = view.dtype;
  rows.data = static_cast<const std::byte*>(view.data);
  rows.batch_stride = heads * T * width;
  rows.row_stride = width;
  rows.head_stride = T * width;
  return rows;
}

absl::StatusOr<RowData> WholeRowData(const IndexerKlProblem& p,
                                     const IndexerKlInputs& in) {
  // A tensor the problem uses, viewed whole once its bytes are checked.
  const auto whole = [&](absl::string_view field,
                         const std::optional<TensorView>& view, int64_t width,
                         int64_t heads) -> absl::StatusOr<RowView> {
    if (!view.has_value()) return Invalid(field, "must be given", "none");
    RETURN_IF_ERROR(CheckBytes(field, *view));
    return WholeRows(*view, p.T, width, heads);
  };
  RowData rows;
  ASSIGN_OR_RETURN(rows.scores,
                   whole("indexer_scores", in.indexer_scores, p.row_length, 1));
  if (p.sparse()) {
    ASSIGN_OR_RETURN(rows.indices,
                     whole("topk_indices", in.topk_indices, p.row_length, 1));
  }
  if (p.per_head()) {
    ASSIGN_OR_RETURN(rows.target, whole("attention_logits", in.attention_logits,
                                        p.row_length, p.H));
  } else {
    ASSIGN_OR_RETURN(rows.target, whole("attention_weights",
                                        in.attention_weights, p.row_length, 1));
  }
  if (p.has_attention_mask) {
    ASSIGN_OR_RETURN(rows.mask,
                     whole("attention_mask", in.attention_mask, p.S, 1));
  }
  return rows;
}

}  // namespace klserve
