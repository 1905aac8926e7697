#ifndef KLSERVE_KERNELS_BACKEND_H_
#define KLSERVE_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/key_grad_fold.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"
#include "kernels/stop_check.h"

// The interface a compute backend (CPU, CUDA) implements: compute a block of
// consecutive rows. Computing blocks in row order and folding each into one
// LossAccumulator gives bit-identical results whatever the block boundaries.

namespace klserve {

// Where the projections form's per-row outputs of a run of rows go (buffers
// of those rows, from its first; null when not asked for), and the scale of
// its gradients.
struct ProjectionsRowOutputs {
  std::byte* d_index_query = nullptr;    // [rows, H_I, D_I]
  std::byte* d_index_weights = nullptr;  // [rows, H_I]
  DType grad_dtype = DType::kFloat32;
  int32_t* topk_indices = nullptr;  // [rows, K], the service's selection
  // c / N * grad_scale; with want_grad false no gradient is computed.
  double grad_scale = 0;
  bool want_grad = false;
};

// Where a block's outputs go.
struct BlockOutputs {
  // Gradient rows, laid out like the scores ([.., K] per row, no heads);
  // data == nullptr writes no gradient.
  std::byte* grad = nullptr;
  DType grad_dtype = DType::kFloat32;
  int64_t grad_origin_row = 0;    // the row at `grad`
  int64_t grad_batch_stride = 0;  // elements, as in RowView
  int64_t grad_row_stride = 0;
  // c / N * grad_scale (problem.h's GradScale): the gradient is this
  // factor times dKL/dI.
  double grad_scale = 0;
  // Per-row KL of the block's rows ([rows.size()]), or null.
  double* row_kl = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual std::string_view name() const = 0;
  // What it runs on, for people: "2 threads, AVX-512", a GPU's name.
  virtual std::string device() const = 0;
  // Host threads it computes with.
  virtual int threads() const = 0;

  // Computes rows `rows` of `problem` reading the per-row tensors from
  // `data` (the problem's own `rows`, or a block of rows sent separately),
  // writes the outputs and folds the rows, in order, into `accumulator`.
  // Data errors are INVALID_ARGUMENT naming the tensor and the first bad
  // position (the one in the lowest row). Safe to call concurrently.
  virtual absl::Status ComputeRows(const IndexerKlProblem& problem,
                                   const RowData& data, RowRange rows,
                                   const BlockOutputs& outputs,
                                   LossAccumulator& accumulator) = 0;

  // The projections form (kernels/projections_computation.h): computes the
  // query rows `rows`, whole tiles of problem.TileOf, from `data`: row r's
  // result into results[r - rows.begin], its per-row outputs into `outputs`
  // (rows from rows.begin on), and each tile's d_index_key contributions
  // into `key_grad`. Data errors are INVALID_ARGUMENT naming the tensor and
  // the first bad position (the lowest row's). `stop`, when set, is asked
  // between steps of each tile, from any of the backend's threads; its error
  // ends the call. A backend that does not compute this form answers
  // UNIMPLEMENTED.
  virtual absl::Status ComputeProjectionRows(
      const ProjectionsProblem& /*problem*/, const ProjectionsRowData& /*data*/,
      RowRange /*rows*/, const ProjectionsRowOutputs& /*outputs*/,
      RowResult* /*results*/, KeyGradFold& /*key_grad*/,
      const StopCheck& /*stop*/) {
    return ProjectionsUnimplemented();
  }
  // MEAN_VALID's N without row_valid: how many of `rows` have a valid key
  // (checking the client's top-k indices on the way). `stop`, when set, is
  // asked between chunks of rows, as ComputeProjectionRows asks it.
  virtual absl::StatusOr<int64_t> CountProjectionRowsWithKeys(
      const ProjectionsProblem& /*problem*/, const ProjectionsRowData& /*data*/,
      RowRange /*rows*/, const StopCheck& /*stop*/) {
    return ProjectionsUnimplemented();
  }

 private:
  absl::Status ProjectionsUnimplemented() const {
    return absl::UnimplementedError(
        absl::StrCat("query: the ", std::string(name()),
                     " backend does not compute the projections form; "
                     "--backend=auto or cpu serves it on the CPU"));
  }
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_BACKEND_H_
