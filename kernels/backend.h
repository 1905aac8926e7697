#ifndef KLSERVE_KERNELS_BACKEND_H_
#define KLSERVE_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"

// The interface a compute backend (CPU, CUDA) implements: compute a block of
// consecutive rows. Computing blocks in row order and folding each into one
// LossAccumulator gives bit-identical results whatever the block boundaries.

namespace klserve {

struct RowRange {
  int64_t begin = 0;  // global row index b * T + t
  int64_t end = 0;
  int64_t size() const { return end - begin; }
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
  // c / N: the gradient is grad_scale * dKL/dI.
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

  // The projections form (kernels/projections_loss.h), whole: finds N,
  // writes the outputs and folds every row, in order, into `accumulator`.
  // Its inputs' values are already checked finite. A backend that does not
  // compute this form answers UNIMPLEMENTED.
  virtual absl::Status ComputeProjections(const ProjectionsProblem& /*problem*/,
                                          const ProjectionsOutputs& /*outputs*/,
                                          LossAccumulator& /*accumulator*/,
                                          int64_t& /*denominator*/) {
    return absl::UnimplementedError(
        absl::StrCat("query: the ", std::string(name()),
                     " backend does not compute the projections form; "
                     "--backend=auto or cpu serves it on the CPU"));
  }
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_BACKEND_H_
