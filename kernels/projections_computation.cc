#include "kernels/projections_computation.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/fold_rows.h"
#include "kernels/non_finite.h"
#include "kernels/row_rules.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

// "<field>: <rule>, got <found> at (b=.., t=.., ...)": element i of a
// tensor of shape `dims`, whose letters name its dimensions.
absl::Status ValueError(absl::string_view field, absl::string_view letters,
                        absl::Span<const int64_t> dims, int64_t i,
                        absl::string_view rule, const char* found) {
  std::vector<int64_t> index(dims.size());
  for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
    index[d] = i % dims[d];
    i /= dims[d];
  }
  std::string where;
  for (size_t d = 0; d < index.size(); ++d) {
    absl::StrAppend(&where, d == 0 ? "" : ", ", letters.substr(d, 1), "=",
                    index[d]);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", rule, ", got ", found, " at (", where, ")"));
}

// A tensor's dimensions and the letters that name them.
struct TensorLayout {
  std::string letters;
  std::vector<int64_t> dims;
};

// A per-row tensor's, [B, T, row...] (not lse's, which is [B, H, T]).
TensorLayout RowsLayoutOf(const ProjectionsProblem& p, const RowShape& row) {
  return {absl::StrCat("bt", row.letters), row.ShapeOf({p.B, p.T})};
}

constexpr char kFiniteRule[] = "every value must be finite";
constexpr char kNonFinite[] = "NaN or infinity";

// The query side's values of rows `rows`: finite projections; an lse with
// no NaN (+inf is the usual value on rows without a valid key).
absl::Status CheckQueryRows(const ProjectionsProblem& p,
                            const ProjectionsRowData& data, RowRange rows) {
  for (const ProjectionsRowTensor& tensor : ProjectionsRowTensors(p)) {
    if (!tensor.must_be_finite) continue;
    const RowView& view = data.*tensor.rows;
    const int64_t width = tensor.row.elements();
    // Rows of one block or one batch entry lie together; scan per entry.
    for (int64_t begin = rows.begin; begin < rows.end;) {
      const int64_t end = std::min(rows.end, (begin / p.T + 1) * p.T);
      const int64_t i = FirstNonFinite(view.dtype, view.Row(begin, p.T),
                                       (end - begin) * width, false);
      if (i >= 0) {
        const TensorLayout layout = RowsLayoutOf(p, tensor.row);
        return ValueError(tensor.field, layout.letters, layout.dims,
                          begin * width + i, kFiniteRule, kNonFinite);
      }
      begin = end;
    }
  }
  if (p.has_lse) {
    for (int64_t row = rows.begin; row < rows.end; ++row) {
      for (int64_t h = 0; h < p.H; ++h) {
        if (FirstNonFinite(DType::kFloat32, data.lse.Row(row, p.T, h), 1,
                           true) == 0) {
          return ValueError("lse", "bht", {p.B, p.H, p.T},
                            (row / p.T * p.H + h) * p.T + row % p.T,
                            "must hold no NaN", "NaN");
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKeySide(const ProjectionsProblem& p) {
  for (const auto& [field, view, letters] :
       {std::tuple{"key", &p.key, "bshd"},
        std::tuple{"index_key", &p.index_key, "bsd"}}) {
    const int64_t n = view->byte_size / DTypeSize(view->dtype);
    const int64_t i = FirstNonFinite(
        view->dtype, static_cast<const std::byte*>(view->data), n, false);
    if (i < 0) continue;
    return ValueError(field, letters, view->shape, i, kFiniteRule, kNonFinite);
  }
  return absl::OkStatus();
}

// Gradient elements [first, first + n) of `field`, written at `data` in
// `dtype`: each must be finite. The logits form's gradient is bounded by
// |c / N * grad_scale| (CheckGradScale), but the projections' gradients
// grow with the projections themselves, so one past the dtype's range would
// otherwise go back as an infinity with an OK status.
absl::Status CheckGradient(absl::string_view field, DType dtype,
                           const std::byte* data, int64_t first, int64_t n,
                           absl::FunctionRef<TensorLayout()> layout_of) {
  const int64_t i = FirstNonFinite(dtype, data, n, false);
  if (i < 0) return absl::OkStatus();
  const TensorLayout layout = layout_of();  // only for the error
  return ValueError(
      field, layout.letters, layout.dims, first + i,
      absl::StrCat("the gradient must be finite in ", DTypeName(dtype),
                   " (lower grad_scale or scaling_factor, or ask for a wider "
                   "grad_dtype)"),
      kNonFinite);
}

// Copies n rows' elements (width of them, `size` bytes each) of `from`
// from row r on into `to`.
void CopyRows(const RowView& from, int64_t r, int64_t T, int64_t n,
              int64_t width, std::byte* to) {
  const int64_t size = DTypeSize(from.dtype);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(to + i * width * size, from.Row(r + i, T), width * size);
  }
}

// The held rows' buffers for a whole tile, in the order of
// ProjectionsRowTensors (0 bytes for a tensor the problem has not).
std::array<ProjectionsComputation::HeldTensor, kNumProjectionsRowTensors>
HeldBuffers(const ProjectionsProblem& p) {
  const std::array<ProjectionsRowTensor, kNumProjectionsRowTensors> tensors =
      ProjectionsRowTensors(p);
  std::array<ProjectionsComputation::HeldTensor, kNumProjectionsRowTensors>
      held;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ProjectionsRowTensor& tensor = tensors[i];
    held[i] = {tensor.field, tensor.used
                                 ? p.max_tile_rows() * tensor.row.elements() *
                                       DTypeSize(tensor.dtype)
                                 : 0};
  }
  return held;
}

// MEAN_VALID's N where a row's keys follow from the causal cut and the key
// padding alone (no per-row tensor: segment ids, key bounds, a mask, the
// client's indices): row t of batch entry b has a key iff its causal end
// passes b's first unpadded key. In O(B * S), whatever T a stream's header
// declares, where no bytes bound it.
std::optional<int64_t> RowsWithKeysInClosedForm(const ProjectionsProblem& pp) {
  const IndexerKlProblem& p = pp.server_topk ? *pp.selection : pp.logits;
  if (p.sparse() || p.segment_ids_q != nullptr || p.key_start != nullptr ||
      p.has_attention_mask) {
    return std::nullopt;
  }
  int64_t count = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    int64_t first = 0;  // b's first unpadded key (S: none)
    if (p.key_padding_mask != nullptr) {
      const std::byte* padding = p.key_padding_mask + b * p.S;
      while (first < p.S && padding[first] == std::byte{0}) ++first;
    }
    if (first >= p.S) continue;
    count += p.T - CausalFirstRow(p.options.causal, first, p.q_offset, p.T);
  }
  return count;
}

}  // namespace

std::byte* ProjectionsRowOutputTensor::BytesIn(
    const ProjectionsBlockOutputs& outputs) const {
  return std::visit(
      [&](auto member) {
        return reinterpret_cast<std::byte*>(outputs.*member);
      },
      output);
}

void ProjectionsRowOutputTensor::SetIn(ProjectionsBlockOutputs& outputs,
                                       std::byte* bytes) const {
  std::visit(
      [&](auto member) {
        using Pointer = std::remove_reference_t<decltype(outputs.*member)>;
        outputs.*member = reinterpret_cast<Pointer>(bytes);
      },
      output);
}

std::array<ProjectionsRowOutputTensor, kNumProjectionsRowOutputs>
ProjectionsRowOutputTensors(const ProjectionsProblem& p) {
  const IndexerKlOptions& o = p.logits.options;
  using Out = ProjectionsBlockOutputs;
  return {{
      {.field = "d_index_query",
       .wanted = o.want_grad,
       .gradient = true,
       .dtype_name = DTypeName(o.grad_dtype),
       .element_bytes = DTypeSize(o.grad_dtype),
       .row = {{p.H_I, p.D_I}, "hd"},
       .output = &Out::d_index_query},
      {.field = "d_index_weights",
       .wanted = o.want_grad,
       .gradient = true,
       .dtype_name = DTypeName(o.grad_dtype),
       .element_bytes = DTypeSize(o.grad_dtype),
       .row = {{p.H_I, 1}, "h"},
       .output = &Out::d_index_weights},
      {.field = "topk_indices",
       .wanted = p.server_topk,
       .gradient = false,
       .dtype_name = DTypeName(DType::kInt32),
       .element_bytes = sizeof(int32_t),
       .row = {{p.K, 1}, "k"},
       .output = &Out::topk_indices},
      {.field = "row_kl",
       .wanted = o.want_row_kl,
       .gradient = false,
       .dtype_name = "FP64",
       .element_bytes = sizeof(double),
       .row = {{1, 1}, ""},
       .output = &Out::row_kl},
  }};
}

absl::Status CheckNextBlock(int64_t next_row, int64_t row_begin,
                            int64_t num_rows, int64_t total_rows) {
  if (row_begin == next_row && num_rows >= 1 &&
      num_rows <= total_rows - next_row) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "row_begin, num_rows: blocks must come in order without gaps within "
      "the B*T = ",
      total_rows, " rows; expected row ", next_row, ", got [", row_begin, ", +",
      num_rows, ")"));
}

absl::StatusOr<ProjectionsComputation> ProjectionsComputation::Create(
    Backend& backend, const ProjectionsProblem& problem, StopCheck stop) {
  RETURN_IF_ERROR(CheckKeySide(problem));
  return ProjectionsComputation(backend, problem, std::move(stop));
}

ProjectionsComputation::ProjectionsComputation(
    Backend& backend, const ProjectionsProblem& problem, StopCheck stop)
    : backend_(&backend),
      problem_(&problem),
      stop_(std::move(stop)),
      denominator_(problem.logits.denominator),
      key_grad_(std::make_unique<KeyGradFold>(problem.key_grad_sum_size(),
                                              problem.S, problem.D_I)) {}

ProjectionsComputation::HeldBytes ProjectionsComputation::MaxHeldBytes(
    const ProjectionsProblem& p) {
  HeldBytes held{.largest = {"query", 0}};
  for (const HeldTensor& tensor : HeldBuffers(p)) {
    // Each fits in 64 bits (its tensor does); their sum, from a stream
    // header's specs, need not.
    if (__builtin_add_overflow(held.total, tensor.bytes, &held.total)) {
      held.total = std::numeric_limits<int64_t>::max();
    }
    if (tensor.bytes > held.largest.bytes) held.largest = tensor;
  }
  return held;
}

void ProjectionsComputation::MakeRoomToHold() {
  const std::array<HeldTensor, kNumProjectionsRowTensors> buffers =
      HeldBuffers(*problem_);
  for (size_t i = 0; i < buffers.size(); ++i) {
    held_bytes_[i].resize(buffers[i].bytes);
  }
}

bool ProjectionsComputation::counts_without_rows() const {
  return !problem_->logits.has_attention_mask &&
         (!problem_->sparse() || problem_->server_topk);
}

absl::Status ProjectionsComputation::Count(const ProjectionsRowData& rows) {
  int64_t counted = 0;
  if (const std::optional<int64_t> n = RowsWithKeysInClosedForm(*problem_)) {
    counted = *n;
  } else {
    ASSIGN_OR_RETURN(counted,
                     backend_->CountProjectionRowsWithKeys(
                         *problem_, rows, {0, problem_->num_rows()}, stop_));
  }
  RETURN_IF_ERROR(CheckGradScale(problem_->logits, counted));
  denominator_ = counted;
  return absl::OkStatus();
}

absl::StatusOr<RowRange> ProjectionsComputation::Compute(
    RowRange rows, const ProjectionsRowData& data,
    const ProjectionsBlockOutputs& out) {
  const ProjectionsProblem& p = *problem_;
  RETURN_IF_ERROR(
      CheckNextBlock(next_row_, rows.begin, rows.size(), p.num_rows()));
  if (!denominator_) {
    return absl::FailedPreconditionError(
        "ProjectionsComputation: N must be counted before the rows");
  }
  if (out.capacity_rows < held_rows() + rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("outputs: must hold ", held_rows() + rows.size(),
                     " rows, got ", out.capacity_rows));
  }
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(p)) {
    if (tensor.wanted && tensor.BytesIn(out) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor.field, ": an output buffer is required (see the options)"));
    }
  }
  RETURN_IF_ERROR(CheckQueryRows(p, data, rows));
  next_row_ = rows.end;

  const int64_t first = held_rows() > 0 ? held_.begin : rows.begin;
  int64_t r = rows.begin;
  if (held_rows() > 0) {
    // Complete the held tile with this block's first rows, if it can.
    const int64_t tile_end = p.TileOf(held_.begin).end;
    const int64_t take = std::min(rows.end, tile_end) - r;
    Hold({r, r + take}, data);
    r += take;
    if (held_.end < tile_end) return RowRange{held_.begin, held_.begin};
    ASSIGN_OR_RETURN(const ProjectionsRowData held, HeldRows());
    RETURN_IF_ERROR(ComputeTiles(held_, held, out));
    held_ = {};
  }
  // The whole tiles in the rest of the block, then the rows after the last.
  const RowRange last = p.TileOf(rows.end - 1);
  const int64_t cut = last.end == rows.end ? rows.end : last.begin;
  if (cut > r) {
    RETURN_IF_ERROR(ComputeTiles({r, cut}, data, Skip(out, r - first)));
  }
  if (cut < rows.end) {
    held_ = {std::max(cut, r), std::max(cut, r)};
    Hold({held_.begin, rows.end}, data);
  }
  return RowRange{first, std::max(r, cut)};
}

ProjectionsBlockOutputs ProjectionsComputation::Skip(
    const ProjectionsBlockOutputs& out, int64_t rows) const {
  ProjectionsBlockOutputs rest = out;
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(*problem_)) {
    if (std::byte* bytes = tensor.BytesIn(rest); bytes != nullptr) {
      tensor.SetIn(rest, bytes + rows * tensor.row_bytes());
    }
  }
  rest.capacity_rows -= rows;
  return rest;
}

absl::Status ProjectionsComputation::ComputeTiles(
    RowRange rows, const ProjectionsRowData& data,
    const ProjectionsBlockOutputs& out) {
  const ProjectionsProblem& p = *problem_;
  // Sixteen tiles per thread a chunk: few enough that the row results held
  // (results_, 40 bytes a row) stay small, enough that the threads' uneven
  // tiles (causal rows grow) even out, and that the threads' tile buffers,
  // given back after each chunk, are not faulted in again too often (four
  // tiles a thread made a dense 4096 call 4-5% slower). The chunks fold in
  // row order, as a stream's blocks do, so the bits are those of one call.
  const int64_t chunk_tiles = 16 * std::max(1, backend_->threads());
  for (int64_t begin = rows.begin; begin < rows.end;) {
    int64_t end = begin;
    for (int64_t i = 0; i < chunk_tiles && end < rows.end; ++i) {
      end = p.TileOf(end).end;
    }
    RETURN_IF_ERROR(
        ComputeChunk({begin, end}, data, Skip(out, begin - rows.begin)));
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status ProjectionsComputation::ComputeChunk(
    RowRange rows, const ProjectionsRowData& data,
    const ProjectionsBlockOutputs& out) {
  const ProjectionsProblem& p = *problem_;
  const IndexerKlOptions& options = p.logits.options;
  ProjectionsRowOutputs row_outputs;
  row_outputs.want_grad = options.want_grad;
  row_outputs.grad_scale = GradScale(p.logits, *denominator_);
  row_outputs.grad_dtype = options.grad_dtype;
  row_outputs.d_index_query = out.d_index_query;
  row_outputs.d_index_weights = out.d_index_weights;
  row_outputs.topk_indices = out.topk_indices;
  results_.assign(rows.size(), RowResult());
  RETURN_IF_ERROR(backend_->ComputeProjectionRows(
      p, data, rows, row_outputs, results_.data(), *key_grad_, stop_));
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(p)) {
    if (!tensor.gradient || !tensor.wanted) continue;
    const int64_t width = tensor.row.elements();
    RETURN_IF_ERROR(CheckGradient(tensor.field, options.grad_dtype,
                                  tensor.BytesIn(out), rows.begin * width,
                                  rows.size() * width,
                                  [&] { return RowsLayoutOf(p, tensor.row); }));
  }
  FoldRows(p.logits, rows.begin, results_, out.row_kl, accumulator_);
  return absl::OkStatus();
}

void ProjectionsComputation::Hold(RowRange rows,
                                  const ProjectionsRowData& data) {
  const ProjectionsProblem& p = *problem_;
  if (held_bytes_[0].empty()) MakeRoomToHold();  // the query's, never empty
  const int64_t at = rows.begin - held_.begin;   // rows already held
  const std::array<ProjectionsRowTensor, kNumProjectionsRowTensors> tensors =
      ProjectionsRowTensors(p);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const ProjectionsRowTensor& tensor = tensors[t];
    if (!tensor.used) continue;
    const RowView& from = data.*tensor.rows;
    std::byte* to = held_bytes_[t].data();
    const int64_t size = DTypeSize(tensor.dtype);
    if (!tensor.head_major) {
      CopyRows(from, rows.begin, p.T, rows.size(), tensor.row.elements(),
               to + at * tensor.row.elements() * size);
      continue;
    }
    // [H, p.max_tile_rows()]: a head's rows together, room for a tile.
    for (int64_t h = 0; h < p.H; ++h) {
      for (int64_t i = 0; i < rows.size(); ++i) {
        std::memcpy(to + (h * p.max_tile_rows() + at + i) * size,
                    from.Row(rows.begin + i, p.T, h), size);
      }
    }
  }
  held_.end = rows.end;
}

absl::StatusOr<ProjectionsRowData> ProjectionsComputation::HeldRows() const {
  const ProjectionsProblem& p = *problem_;
  ProjectionsBlockBytes bytes;
  const std::array<ProjectionsRowTensor, kNumProjectionsRowTensors> tensors =
      ProjectionsRowTensors(p);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const ProjectionsRowTensor& tensor = tensors[t];
    if (!tensor.used) continue;
    bytes.*tensor.block_data = held_bytes_[t].data();
    bytes.*tensor.block_bytes =
        held_rows() * tensor.row.elements() * DTypeSize(tensor.dtype);
  }
  ASSIGN_OR_RETURN(ProjectionsRowData rows,
                   BlockProjectionsRows(p, held_, bytes));
  rows.lse.head_stride = p.max_tile_rows();  // held with room for a whole tile
  return rows;
}

absl::StatusOr<IndexerKlResult> ProjectionsComputation::Finish(
    std::byte* d_index_key) {
  const ProjectionsProblem& p = *problem_;
  if (next_row_ != p.num_rows() || held_rows() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_begin, num_rows: the blocks covered rows [0, ",
                     next_row_, ") of the B*T = ", p.num_rows(), " rows"));
  }
  if (p.logits.options.want_grad) {
    if (d_index_key == nullptr) {
      return absl::InvalidArgumentError(
          "d_index_key: an output buffer is required for the gradient");
    }
    key_grad_->Store(p.logits.options.grad_dtype, d_index_key);
    const std::array<int64_t, 3> shape = p.key_gradient_shape();
    RETURN_IF_ERROR(CheckGradient(
        "d_index_key", p.logits.options.grad_dtype, d_index_key, 0,
        shape[0] * shape[1] * shape[2], [&] {
          return TensorLayout{"bsd", {shape.begin(), shape.end()}};
        }));
  }
  return LossResultOf(p.logits, accumulator_, *denominator_);
}

}  // namespace klserve
