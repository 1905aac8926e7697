#ifndef KLSERVE_KERNELS_PROJECTIONS_PROBLEM_H_
#define KLSERVE_KERNELS_PROJECTIONS_PROBLEM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/projection_tile_memory.h"
#include "kernels/dtype.h"
#include "kernels/problem.h"
#include "kernels/tensor_view.h"

// The projections form of docs/spec.md: the job sends the main attention's
// q and k and the lightning indexer's q_I, k_I and head weights; the service
// recomputes the main logits a and the indexer scores I tile by tile, never
// holding a [T, S] or [H, T, S] tensor, and returns the gradients of the
// indexer's inputs.
//
// Letters: B batch, T query rows, S keys, H main heads of dimension D, H_kv
// key heads (H_kv divides H), H_I indexer heads of dimension D_I, K top-k
// slots.

namespace klserve {

struct ProjectionsInputs {
  TensorView query;          // [B,T,H,D]
  TensorView key;            // [B,S,H_kv,D]
  TensorView index_query;    // [B,T,H_I,D_I]
  TensorView index_key;      // [B,S,D_I]
  TensorView index_weights;  // [B,T,H_I]
  // FP32 [B,H,T]: each head's log-sum-exp over the row's valid keys (in the
  // sparse stage: over the valid slots of topk_indices).
  std::optional<TensorView> lse;
  // The sparse stage with the client's selection, [B,T,K] INT32.
  std::optional<TensorView> topk_indices;
  // The masks, as in IndexerKlInputs.
  std::optional<TensorView> segment_ids_q;
  std::optional<TensorView> segment_ids_kv;
  std::optional<TensorView> attention_mask;
  std::optional<TensorView> key_padding_mask;
  std::optional<TensorView> row_valid;
  std::optional<TensorView> key_start;
  std::optional<TensorView> key_end;
};

struct ProjectionsOptions {
  // Masks, flavour, reduction, c, grad_scale, grad dtype, row KL and
  // diagnostics as in the logits form. softmax_scale multiplies q . k;
  // num_keys is 0 or S.
  IndexerKlOptions loss;
  // Multiplies index_weights; default H_I^-1/2 * D_I^-1/2. Finite.
  std::optional<double> index_weight_scale;
  bool use_relu = true;
  // > 0: the sparse stage with the service's own selection of K keys per
  // row. Not with topk_indices or lse.
  int64_t topk = 0;
};

// A validated projections problem. Only Create makes one. Value rules that
// need the data (NaN or infinities in the projections, scores that overflow
// float32, the lse's head mass, index ranges) are checked as it computes.
class ProjectionsProblem {
 public:
  // Checks shapes, dtypes and options; errors are INVALID_ARGUMENT
  // "<field>: <rule>, got <value>".
  static absl::StatusOr<ProjectionsProblem> Create(
      const ProjectionsInputs& inputs, const ProjectionsOptions& options);

  int64_t B = 0, T = 0, S = 0;
  int64_t H = 0, H_kv = 0, D = 0;
  int64_t H_I = 0, D_I = 0;
  // K in the sparse stage (client indices or topk), 0 in the dense stage.
  int64_t K = 0;
  bool server_topk = false;
  float index_weight_scale = 0;
  bool use_relu = true;
  // The computation's unit: tiles of this many consecutive query rows of
  // one batch entry, from each entry's first row (the last of an entry may
  // be shorter). Fixed by the problem's shape alone
  // (cpu::ProjectionTileRows), so that what is summed over rows
  // (d_index_key) is summed alike whatever the thread count or the stream's
  // blocks. Dense: large enough for the tile's matrix products to run near
  // the BLAS's rate, few enough for its [rows, S] buffers to stay within
  // cpu::kTileRowsBytes; sparse: each row gathers its own keys, and the
  // tile bounds the d_index_key contributions kept for the fold.
  int64_t tile_rows = 0;
  // The most rows one tile has: tile_rows, or T where a batch entry is
  // shorter.
  int64_t max_tile_rows() const { return tile_rows < T ? tile_rows : T; }
  // What one compute thread holds while it computes one of the tiles, at
  // most: it grows with S (K in the sparse stage) and the head sizes, not
  // with the request's bytes.
  cpu::ProjectionTileScratch thread_scratch() const;

  // The logits-form problem that a and I describe: per-head, over S keys
  // (dense) or K slots (sparse). Its masks, options, N and row rules are
  // the projections form's; its per-row tensors carry no bytes here: the
  // computation forms them tile by tile.
  IndexerKlProblem logits;
  // With server_topk: the dense problem over all S keys that the selection
  // ranks the valid keys of.
  std::optional<IndexerKlProblem> selection;

  // The key side, whole, with its bytes.
  TensorView key, index_key;
  // The query side's dtypes (its rows come as ProjectionsRowData).
  DType query_dtype = DType::kFloat32;
  DType index_query_dtype = DType::kFloat32;
  DType index_weights_dtype = DType::kFloat32;
  bool has_lse = false;

  bool sparse() const { return K > 0; }
  int64_t num_rows() const { return B * T; }
  // The float64 d_index_key sum's elements (KeyGradFold): B S D_I with the
  // gradients, else none.
  int64_t key_grad_sum_size() const {
    return logits.options.want_grad ? B * S * D_I : 0;
  }
  // d_index_key's shape: the key side's gradient, which a call's answer or a
  // stream's last message carries whole.
  std::array<int64_t, 3> key_gradient_shape() const { return {B, S, D_I}; }
  // The tile holding row r: [begin, end).
  RowRange TileOf(int64_t r) const;

 private:
  cpu::ProjectionTileShape TileShape() const;

  explicit ProjectionsProblem(IndexerKlProblem logits)
      : logits(std::move(logits)) {}
};

// Where the query side's rows live: RowData's rule (kernels/problem.h) for
// each per-row tensor of the form. Absent tensors have no data.
struct ProjectionsRowData {
  RowView query;          // H * D elements a row
  RowView index_query;    // H_I * D_I
  RowView index_weights;  // H_I
  RowView lse;            // FP32, one a head (head_stride apart)
  RowView indices;        // the client's topk_indices: K
  RowView mask;           // attention_mask: S
};

// The views of all rows of the query side in `inputs` (the inputs `problem`
// was created from), after checking that each holds its bytes
// (INVALID_ARGUMENT naming the tensor otherwise).
absl::StatusOr<ProjectionsRowData> WholeProjectionsRows(
    const ProjectionsProblem& problem, const ProjectionsInputs& inputs);

// The raw bytes of a block of n consecutive query rows (the stream's):
// query [n, H, D], index_query [n, H_I, D_I], index_weights [n, H_I],
// lse [H, n] (head-major), topk_indices [n, K], attention_mask [n, S]; a
// tensor the problem does not use is empty. Not copied.
struct ProjectionsBlockBytes {
  const void* query = nullptr;
  int64_t query_bytes = 0;
  const void* index_query = nullptr;
  int64_t index_query_bytes = 0;
  const void* index_weights = nullptr;
  int64_t index_weights_bytes = 0;
  const void* lse = nullptr;
  int64_t lse_bytes = 0;
  const void* topk_indices = nullptr;
  int64_t topk_indices_bytes = 0;
  const void* attention_mask = nullptr;
  int64_t attention_mask_bytes = 0;
};

// A row's shape, up to two dimensions, and their letters, which follow the
// rows' "bt" in a tensor's layout: [H, D] "hd", [K] "k", [] "". The letters
// give the rank; dims past it are unused (written 1).
struct RowShape {
  std::array<int64_t, 2> dims;
  const char* letters;

  size_t rank() const;
  int64_t elements() const;
  // The shape of `rows` such rows: `rows` (their dimensions) then the row's.
  std::vector<int64_t> ShapeOf(std::initializer_list<int64_t> rows) const;
};

// One per-row tensor of the query side, as each query row (b, t) has it.
struct ProjectionsRowTensor {
  const char* field;
  // Whether the problem has it: the projections always, lse and
  // attention_mask when sent, topk_indices with the client's selection.
  bool used;
  DType dtype;
  // [H, D], [H_I, D_I], [H_I], [H] (lse: one a head), [K], [S].
  RowShape row;
  // A projection, whose every value must be finite.
  bool must_be_finite = false;
  // lse alone: [B, H, T] whole and [H, n] in a block, so that a row's H
  // values lie a head's rows apart. The others are [rows, width].
  bool head_major = false;
  std::variant<TensorView ProjectionsInputs::*,
               std::optional<TensorView> ProjectionsInputs::*>
      input;
  RowView ProjectionsRowData::*rows;
  const void* ProjectionsBlockBytes::*block_data;
  int64_t ProjectionsBlockBytes::*block_bytes;
};

// query, index_query, index_weights, lse, topk_indices, attention_mask: the
// form's one table of its per-row inputs. The views of a request's rows and
// of a block's, the checks of their values and the rows a stream holds
// between blocks all read it.
inline constexpr size_t kNumProjectionsRowTensors = 6;
std::array<ProjectionsRowTensor, kNumProjectionsRowTensors>
ProjectionsRowTensors(const ProjectionsProblem& problem);

// Views of the block of rows `rows`, after checking that each tensor holds
// exactly its rows' bytes (INVALID_ARGUMENT naming the tensor otherwise).
absl::StatusOr<ProjectionsRowData> BlockProjectionsRows(
    const ProjectionsProblem& problem, RowRange rows,
    const ProjectionsBlockBytes& bytes);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_PROJECTIONS_PROBLEM_H_
