#include "kernels/projections_problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"
#include "kernels/tensor_checks.h"

namespace klserve {
namespace {

// A projection: a float tensor of the given rank. The key side's must hold
// its bytes; the query side's may carry none (a stream header's: its rows
// come in blocks).
absl::Status CheckProjection(absl::string_view field, const TensorView& view,
                             absl::string_view layout, size_t rank,
                             bool key_side) {
  RETURN_IF_ERROR(CheckDType(field, view, input_dtype::kProjection));
  RETURN_IF_ERROR(CheckLayout(field, view, layout, rank));
  return key_side ? CheckBytes(field, view) : CheckBytesIfAny(field, view);
}

absl::Status CheckShape(absl::string_view field, const TensorView& view,
                        absl::string_view layout,
                        std::initializer_list<int64_t> expected, bool key_side,
                        absl::string_view origin) {
  RETURN_IF_ERROR(CheckTensor(field, view, input_dtype::kProjection, layout,
                              expected, origin));
  return key_side ? CheckBytes(field, view) : CheckBytesIfAny(field, view);
}

// The logits [B, H, T, X] that the projections imply are computed tile by
// tile, never whole, but their size must fit in 64 bits as any tensor's
// does; named for what sets X (`x`), rather than for the logits-form
// tensors the client never sent.
absl::Status CheckImpliedLogits(absl::string_view field, absl::string_view x,
                                int64_t B, int64_t H, int64_t T, int64_t X) {
  if (!ShapeBytes(sizeof(float), {B, H, T, X}).has_value()) {
    return Invalid(field,
                   absl::StrCat("the logits [B, H, T, ", x,
                                "] it implies must have a byte size that "
                                "fits in 64 bits"),
                   ShapeString({B, H, T, X}));
  }
  return absl::OkStatus();
}

// The logits-form problem over `row_length` slots per row that the
// projections describe; `indices` is the sparse stage's [B,T,K] (the
// client's, or a spec of the service's selection).
absl::StatusOr<IndexerKlProblem> LogitsFormProblem(
    const ProjectionsInputs& in, const IndexerKlOptions& options, int64_t B,
    int64_t T, int64_t S, int64_t H, int64_t row_length,
    std::optional<TensorView> indices) {
  IndexerKlInputs logits;
  logits.attention_logits =
      TensorView{.dtype = DType::kFloat32, .shape = {B, H, T, row_length}};
  logits.indexer_scores =
      TensorView{.dtype = DType::kFloat32, .shape = {B, T, row_length}};
  logits.topk_indices = std::move(indices);
  logits.segment_ids_q = in.segment_ids_q;
  logits.segment_ids_kv = in.segment_ids_kv;
  logits.attention_mask = in.attention_mask;
  logits.key_padding_mask = in.key_padding_mask;
  logits.row_valid = in.row_valid;
  logits.key_start = in.key_start;
  logits.key_end = in.key_end;
  IndexerKlOptions with_keys = options;
  with_keys.num_keys = S;
  return IndexerKlProblem::Create(logits, with_keys,
                                  {.rows = "query's shape",
                                   .dense_keys = "key's shape",
                                   .sparse_keys = "key's shape"});
}

}  // namespace

absl::StatusOr<ProjectionsProblem> ProjectionsProblem::Create(
    const ProjectionsInputs& in, const ProjectionsOptions& options) {
  // The main attention fixes B, T, H, D (query) and S, H_kv (key).
  RETURN_IF_ERROR(CheckProjection("query", in.query, "[B, T, H, D]", 4, false));
  const int64_t B = in.query.shape[0], T = in.query.shape[1];
  const int64_t H = in.query.shape[2], D = in.query.shape[3];
  RETURN_IF_ERROR(CheckProjection("key", in.key, "[B, S, H_kv, D]", 4, true));
  const int64_t S = in.key.shape[1], H_kv = in.key.shape[2];
  if (in.key.shape[0] != B || in.key.shape[3] != D) {
    return Invalid("key",
                   absl::StrCat("shape must be [B, S, H_kv, D] with B = ", B,
                                " and D = ", D, " (query's)"),
                   ShapeString(in.key.shape));
  }
  if (H % H_kv != 0) {
    return Invalid("key",
                   absl::StrCat("H_kv must divide the query's H = ", H,
                                " (MHA: H_kv = H; MQA: 1; GQA: a divisor)"),
                   absl::StrCat(H_kv));
  }
  RETURN_IF_ERROR(CheckProjection("index_query", in.index_query,
                                  "[B, T, H_I, D_I]", 4, false));
  const int64_t H_I = in.index_query.shape[2], D_I = in.index_query.shape[3];
  // Where each dimension came from: a query sent transposed would
  // otherwise be reported as the indexer's tensors' error.
  RETURN_IF_ERROR(CheckShape("index_query", in.index_query, "[B, T, H_I, D_I]",
                             {B, T, H_I, D_I}, false,
                             "B and T from query [B, T, H, D]"));
  RETURN_IF_ERROR(CheckShape("index_key", in.index_key, "[B, S, D_I]",
                             {B, S, D_I}, true,
                             "B from query, S from key [B, S, H_kv, D], D_I "
                             "from index_query"));
  RETURN_IF_ERROR(CheckShape("index_weights", in.index_weights, "[B, T, H_I]",
                             {B, T, H_I}, false,
                             "B and T from query, H_I from index_query"));
  if (options.loss.num_keys != 0 && options.loss.num_keys != S) {
    return Invalid("num_keys",
                   absl::StrCat("must be 0 or S = ", S, " (key's S)"),
                   absl::StrCat(options.loss.num_keys));
  }

  // The stage: dense, the client's indices, or the service's selection.
  if (options.topk < 0) {
    return Invalid("topk", "must be >= 1 (or 0: no selection)",
                   absl::StrCat(options.topk));
  }
  const bool server_topk = options.topk > 0;
  if (server_topk && in.topk_indices) {
    return Invalid("topk", "topk and topk_indices exclude each other",
                   absl::StrCat(options.topk, " with topk_indices"));
  }
  if (server_topk && in.lse) {
    return Invalid("lse",
                   "must not be given with topk (the client cannot know the "
                   "service's selection)",
                   "an lse");
  }
  int64_t K = 0;
  std::optional<TensorView> indices;
  if (in.topk_indices) {
    RETURN_IF_ERROR(
        CheckDType("topk_indices", *in.topk_indices, input_dtype::kIndex));
    RETURN_IF_ERROR(
        CheckLayout("topk_indices", *in.topk_indices, "[B, T, K]", 3));
    K = in.topk_indices->shape[2];
    indices = in.topk_indices;
  } else if (server_topk) {
    constexpr int64_t kMaxTopk = (int64_t{1} << 31) - 1;
    if (options.topk > kMaxTopk) {
      return Invalid("topk", "must be below 2^31", absl::StrCat(options.topk));
    }
    K = options.topk;
    indices = TensorView{.dtype = DType::kInt32, .shape = {B, T, K}};
  }

  RETURN_IF_ERROR(CheckImpliedLogits("query", "S", B, H, T, S));
  if (K > 0) {
    RETURN_IF_ERROR(CheckImpliedLogits(
        in.topk_indices ? "topk_indices" : "topk", "K", B, H, T, K));
  }

  const double weight_scale = options.index_weight_scale.value_or(
      1.0 / std::sqrt(static_cast<double>(H_I * D_I)));
  if (!std::isfinite(weight_scale) ||
      !std::isfinite(static_cast<float>(weight_scale))) {
    return Invalid("index_weight_scale", "must be finite in float32",
                   absl::StrCat(weight_scale));
  }

  ASSIGN_OR_RETURN(
      IndexerKlProblem logits,
      LogitsFormProblem(in, options.loss, B, T, S, H, K > 0 ? K : S, indices));
  ProjectionsProblem p(std::move(logits));
  if (server_topk) {
    ASSIGN_OR_RETURN(p.selection, LogitsFormProblem(in, options.loss, B, T, S,
                                                    H, S, std::nullopt));
  }
  p.B = B, p.T = T, p.S = S;
  p.H = H, p.H_kv = H_kv, p.D = D;
  p.H_I = H_I, p.D_I = D_I;
  p.K = K;
  p.server_topk = server_topk;
  p.index_weight_scale = static_cast<float>(weight_scale);
  p.use_relu = options.use_relu;
  p.tile_rows = cpu::ProjectionTileRows(p.TileShape());
  p.key = in.key;
  p.index_key = in.index_key;
  p.query_dtype = in.query.dtype;
  p.index_query_dtype = in.index_query.dtype;
  p.index_weights_dtype = in.index_weights.dtype;
  if (in.lse) {
    RETURN_IF_ERROR(
        CheckTensor("lse", *in.lse, input_dtype::kLse, "[B, H, T]", {B, H, T}));
    RETURN_IF_ERROR(CheckBytesIfAny("lse", *in.lse));
    p.has_lse = true;
  }
  return p;
}

cpu::ProjectionTileShape ProjectionsProblem::TileShape() const {
  return {.S = S,
          .K = K,
          .server_topk = server_topk,
          .H = H,
          .H_kv = H_kv,
          .D = D,
          .H_I = H_I,
          .D_I = D_I};
}

cpu::ProjectionTileScratch ProjectionsProblem::thread_scratch() const {
  return cpu::ProjectionTileScratchOf(TileShape(), max_tile_rows());
}

RowRange ProjectionsProblem::TileOf(int64_t r) const {
  const int64_t b = r / T, t = r % T;
  const int64_t begin = t / tile_rows * tile_rows;
  return {b * T + begin, b * T + std::min(T, begin + tile_rows)};
}

size_t RowShape::rank() const { return std::strlen(letters); }

std::vector<int64_t> RowShape::ShapeOf(
    std::initializer_list<int64_t> rows) const {
  std::vector<int64_t> shape = rows;
  shape.insert(shape.end(), dims.begin(), dims.begin() + rank());
  return shape;
}

int64_t RowShape::elements() const {
  int64_t n = 1;
  for (size_t d = 0; d < rank(); ++d) n *= dims[d];
  return n;
}

std::array<ProjectionsRowTensor, kNumProjectionsRowTensors>
ProjectionsRowTensors(const ProjectionsProblem& p) {
  using In = ProjectionsInputs;
  using Rows = ProjectionsRowData;
  using Block = ProjectionsBlockBytes;
  return {{
      {.field = "query",
       .used = true,
       .dtype = p.query_dtype,
       .row = {{p.H, p.D}, "hd"},
       .must_be_finite = true,
       .input = &In::query,
       .rows = &Rows::query,
       .block_data = &Block::query,
       .block_bytes = &Block::query_bytes},
      {.field = "index_query",
       .used = true,
       .dtype = p.index_query_dtype,
       .row = {{p.H_I, p.D_I}, "hd"},
       .must_be_finite = true,
       .input = &In::index_query,
       .rows = &Rows::index_query,
       .block_data = &Block::index_query,
       .block_bytes = &Block::index_query_bytes},
      {.field = "index_weights",
       .used = true,
       .dtype = p.index_weights_dtype,
       .row = {{p.H_I, 1}, "h"},
       .must_be_finite = true,
       .input = &In::index_weights,
       .rows = &Rows::index_weights,
       .block_data = &Block::index_weights,
       .block_bytes = &Block::index_weights_bytes},
      {.field = "lse",
       .used = p.has_lse,
       .dtype = DType::kFloat32,
       .row = {{p.H, 1}, "h"},
       .head_major = true,
       .input = &In::lse,
       .rows = &Rows::lse,
       .block_data = &Block::lse,
       .block_bytes = &Block::lse_bytes},
      {.field = "topk_indices",
       .used = p.sparse() && !p.server_topk,
       .dtype = DType::kInt32,
       .row = {{p.K, 1}, "k"},
       .input = &In::topk_indices,
       .rows = &Rows::indices,
       .block_data = &Block::topk_indices,
       .block_bytes = &Block::topk_indices_bytes},
      {.field = "attention_mask",
       .used = p.logits.has_attention_mask,
       .dtype = DType::kBool,
       .row = {{p.S, 1}, "s"},
       .input = &In::attention_mask,
       .rows = &Rows::mask,
       .block_data = &Block::attention_mask,
       .block_bytes = &Block::attention_mask_bytes},
  }};
}

absl::StatusOr<ProjectionsRowData> WholeProjectionsRows(
    const ProjectionsProblem& p, const ProjectionsInputs& in) {
  ProjectionsRowData rows;
  for (const ProjectionsRowTensor& tensor : ProjectionsRowTensors(p)) {
    if (!tensor.used) continue;
    const TensorView& view = std::visit(
        [&](auto member) -> const TensorView& {
          if constexpr (std::is_same_v<decltype(member),
                                       TensorView ProjectionsInputs::*>) {
            return in.*member;
          } else {
            return *(in.*member);  // `used`: the problem was made with it
          }
        },
        tensor.input);
    RETURN_IF_ERROR(CheckBytes(tensor.field, view));
    rows.*tensor.rows = tensor.head_major
                            ? WholeRows(view, p.T, 1, p.H)
                            : WholeRows(view, p.T, tensor.row.elements(), 1);
  }
  return rows;
}

absl::StatusOr<ProjectionsRowData> BlockProjectionsRows(
    const ProjectionsProblem& p, RowRange rows,
    const ProjectionsBlockBytes& bytes) {
  const int64_t n = rows.size();
  if (rows.begin < 0 || n < 1 || rows.end > p.num_rows()) {
    return Invalid("row_begin, num_rows",
                   absl::StrCat("the block must lie within the B*T = ",
                                p.num_rows(), " rows"),
                   absl::StrCat("[", rows.begin, ", ", rows.end, ")"));
  }
  ProjectionsRowData out;
  for (const ProjectionsRowTensor& tensor : ProjectionsRowTensors(p)) {
    const int64_t width = tensor.row.elements();
    const void* data = bytes.*tensor.block_data;
    const int64_t size = bytes.*tensor.block_bytes;
    const int64_t want = tensor.used ? n * width * DTypeSize(tensor.dtype) : 0;
    if (size != want || (want > 0 && data == nullptr)) {
      return Invalid(
          tensor.field,
          absl::StrCat("a block of ", n, " rows must hold ", want, " bytes"),
          absl::StrCat(size));
    }
    if (!tensor.used) continue;
    RowView& view = out.*tensor.rows;
    view.dtype = tensor.dtype;
    view.data = static_cast<const std::byte*>(data);
    view.origin_row = rows.begin;
    if (tensor.head_major) {
      // [H, n]: head h's rows n apart.
      view.batch_stride = p.T;
      view.row_stride = 1;
      view.head_stride = n;
    } else {
      // [n, width]: rows are (r - begin) * width apart, which RowView's rule
      // gives with batch_stride T * width and row_stride width.
      view.batch_stride = p.T * width;
      view.row_stride = width;
    }
  }
  return out;
}

}  // namespace klserve
