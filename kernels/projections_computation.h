#ifndef KLSERVE_KERNELS_PROJECTIONS_COMPUTATION_H_
#define KLSERVE_KERNELS_PROJECTIONS_COMPUTATION_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/key_grad_fold.h"
#include "kernels/loss_accumulator.h"
#include "kernels/loss_computation.h"
#include "kernels/projections_problem.h"

// One computation of a projections problem, fed its query rows in order, in
// blocks of any size: the one path that both the unary call (one block of
// all rows) and the stream take, so that they give the same bits.
//
// The backend computes whole tiles (ProjectionsProblem::TileOf). A block
// that ends inside a tile leaves its last rows held here (at most a tile's
// query-side bytes, copied) until the next block completes the tile; a
// block's answer therefore covers the rows it completes, which may begin in
// an earlier block and end before its own end.

namespace klserve {

// Caller-owned outputs of the rows one Compute call completes, from the
// first of them on (null when not asked for): d_index_query [n, H_I, D_I]
// and d_index_weights [n, H_I] in the gradient dtype, the service's
// selection [n, K], row KL [n].
struct ProjectionsBlockOutputs {
  std::byte* d_index_query = nullptr;
  std::byte* d_index_weights = nullptr;
  int32_t* topk_indices = nullptr;
  double* row_kl = nullptr;
  // Rows the buffers hold; Compute needs at most held_rows() + the block's.
  int64_t capacity_rows = 0;
};

// One per-row output of the form, as each query row (b, t) has it.
struct ProjectionsRowOutputTensor {
  const char* field;
  // Whether the problem asks for it: the gradients with want_grad, the
  // service's selection when it selects, row KL with want_row_kl.
  bool wanted;
  // A gradient, whose every value must be finite in the gradient dtype.
  bool gradient;
  // Its wire dtype and that dtype's bytes: the gradient dtype, INT32 or
  // FP64 (an output-only dtype, which DType has not).
  const char* dtype_name;
  int64_t element_bytes;
  RowShape row;  // [H_I, D_I], [H_I], [K], []
  std::variant<std::byte * ProjectionsBlockOutputs::*,
               int32_t * ProjectionsBlockOutputs::*,
               double * ProjectionsBlockOutputs::*>
      output;

  // Unchecked: a row's output is no larger than its input row
  // (index_query, index_weights; K <= S), which a call's bytes or a
  // stream's message limit bounds, times the widest element.
  int64_t row_bytes() const { return row.elements() * element_bytes; }
  // Its bytes in `outputs` (null when they hold none), and setting them.
  std::byte* BytesIn(const ProjectionsBlockOutputs& outputs) const;
  void SetIn(ProjectionsBlockOutputs& outputs, std::byte* bytes) const;
};

// d_index_query, d_index_weights, topk_indices, row_kl: the form's one table
// of its per-row outputs. A block's outputs, the stream's answers and the
// service's output limits read it.
inline constexpr size_t kNumProjectionsRowOutputs = 4;
std::array<ProjectionsRowOutputTensor, kNumProjectionsRowOutputs>
ProjectionsRowOutputTensors(const ProjectionsProblem& problem);

// INVALID_ARGUMENT unless a block of `num_rows` rows from `row_begin` comes
// next: at `next_row`, with at least one row and none past `total_rows` (the
// blocks of a problem come in order without gaps). The stream asks it as
// blocks arrive, Compute again as it takes them.
absl::Status CheckNextBlock(int64_t next_row, int64_t row_begin,
                            int64_t num_rows, int64_t total_rows);

class ProjectionsComputation {
 public:
  // Checks the key side's values (NaN or infinities are INVALID_ARGUMENT
  // naming the tensor and the position). The backend and the problem must
  // outlive the computation; `stop`, when given, is asked before each
  // tile.
  static absl::StatusOr<ProjectionsComputation> Create(
      Backend& backend, const ProjectionsProblem& problem,
      StopCheck stop = nullptr);

  // MEAN_VALID without row_valid: N counts the rows with a valid key, and
  // must be known before any gradient. Count takes it from `rows`, all of
  // the query side's rows (WholeProjectionsRows) or, when the rows' validity
  // needs no per-row tensor (no client indices, no attention_mask), none.
  bool needs_counting() const { return !denominator_.has_value(); }
  bool counts_without_rows() const;
  absl::Status Count(const ProjectionsRowData& rows);

  // The most the held rows take, once a block ends inside a tile: a tile of
  // every query-side tensor (ProjectionsProblem::max_tile_rows() rows), in
  // all and the largest tensor's share.
  struct HeldTensor {
    const char* field;
    int64_t bytes;
  };
  struct HeldBytes {
    int64_t total = 0;
    HeldTensor largest;
  };
  static HeldBytes MaxHeldBytes(const ProjectionsProblem& problem);

  // The rows held back from earlier blocks.
  int64_t held_rows() const { return held_.end - held_.begin; }

  // Computes query rows `rows`, the next ones (INVALID_ARGUMENT naming
  // row_begin otherwise), from `data`: checks their values, computes every
  // tile they complete and writes those rows' outputs into `outputs`, which
  // must have a buffer for each output the problem asks for, and whose
  // gradients must be finite in the gradient dtype (INVALID_ARGUMENT naming
  // the output otherwise). Returns the rows completed (possibly none).
  absl::StatusOr<RowRange> Compute(RowRange rows,
                                   const ProjectionsRowData& data,
                                   const ProjectionsBlockOutputs& outputs);

  // Once every row is computed: d_index_key (key_gradient_shape) into
  // `d_index_key` (when the gradient is asked for; INVALID_ARGUMENT naming
  // it if the buffer is null or an entry is not finite in the gradient
  // dtype) and the result.
  absl::StatusOr<IndexerKlResult> Finish(std::byte* d_index_key);

 private:
  ProjectionsComputation(Backend& backend, const ProjectionsProblem& problem,
                         StopCheck stop);

  // Rows `rows`, whole tiles, from `data`, outputs from `out` on: in chunks
  // of a few tiles per thread (the backend asks `stop_` between the steps of
  // each tile).
  absl::Status ComputeTiles(RowRange rows, const ProjectionsRowData& data,
                            const ProjectionsBlockOutputs& out);
  // One chunk of ComputeTiles.
  absl::Status ComputeChunk(RowRange rows, const ProjectionsRowData& data,
                            const ProjectionsBlockOutputs& out);
  // `out` advanced by `rows` rows.
  ProjectionsBlockOutputs Skip(const ProjectionsBlockOutputs& out,
                               int64_t rows) const;
  // Sizes the held rows' buffers for a whole tile (MaxHeldBytes). Only once
  // a block ends inside a tile: a unary call's one block never does, and
  // needs no room (a tile's room for a request of one long row was 128
  // times the request).
  void MakeRoomToHold();
  // Appends rows `rows` of `data` to the held rows.
  void Hold(RowRange rows, const ProjectionsRowData& data);
  // The held rows as a block's views.
  absl::StatusOr<ProjectionsRowData> HeldRows() const;

  Backend* backend_;
  const ProjectionsProblem* problem_;
  StopCheck stop_;
  std::optional<int64_t> denominator_;
  int64_t next_row_ = 0;
  RowRange held_;
  // The held rows' bytes of each ProjectionsRowTensors entry, in a block's
  // layout (ProjectionsBlockBytes), each with room for a whole tile once
  // MakeRoomToHold has run.
  std::array<std::vector<std::byte>, kNumProjectionsRowTensors> held_bytes_;
  std::vector<RowResult> results_;
  LossAccumulator accumulator_;
  std::unique_ptr<KeyGradFold> key_grad_;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_PROJECTIONS_COMPUTATION_H_
