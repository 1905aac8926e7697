#ifndef KLSERVE_KERNELS_LOSS_COMPUTATION_H_
#define KLSERVE_KERNELS_LOSS_COMPUTATION_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"

// One computation of a problem's loss, fed its rows in blocks: the one path
// that both the unary call (one block) and the stream (many) take, so that
// they give the same bits.

namespace klserve {

struct Diagnostics {
  double mean_entropy_p = 0;  // nats, over counted rows
  double mean_entropy_q = 0;
  // Mean over counted rows of the target mass on the recall_k keys with the
  // highest indexer scores; absent when recall_k is 0.
  std::optional<double> topk_recall;
};

struct IndexerKlResult {
  double loss = 0;           // c * sum_t KL_t / N (0 when N = 0)
  double unscaled_loss = 0;  // sum_t KL_t / N
  double kl_sum = 0;         // sum_t KL_t over the counted rows
  int64_t denominator = 0;   // N
  int64_t rows_counted = 0;  // rows that contribute a KL
  int64_t rows_fully_masked = 0;
  int64_t rows_zero_target = 0;
  std::optional<Diagnostics> diagnostics;  // when options.want_diagnostics
};

// Caller-owned output buffers of a block of n consecutive rows (all B*T rows
// for a whole problem).
struct LossOutputs {
  // [n, S or K] in options.grad_dtype (for a whole problem that is
  // [B, T, S or K]); required when options.want_grad.
  void* grad = nullptr;
  int64_t grad_byte_size = 0;
  // [n] per-row KL (unscaled, 0 for rows that do not count); required when
  // options.want_row_kl.
  double* row_kl = nullptr;
  int64_t row_kl_size = 0;
};

// The result from every row folded into `accumulator`, with N = denominator.
IndexerKlResult LossResultOf(const IndexerKlProblem& problem,
                             const LossAccumulator& accumulator,
                             int64_t denominator);

// A block that LossComputation::Admit accepted as the next one.
struct AdmittedBlock {
  RowRange rows;
  bool counting = false;
};

// Blocks are admitted in order (Admit checks the order), computed in the
// order they were admitted (Compute), then the result is taken (Finish).
// Most problems take one pass over the rows [0, B*T). MEAN_VALID without
// row_valid takes two: its N counts the rows that have a valid key and a
// positive target, known only after every row has been computed once; the
// gradient is written once, already scaled (rescaling a rounded BF16
// gradient would round twice), so a counting pass that writes nothing comes
// first. Any split into blocks, in either pass, gives the same bits.
//
// Admit and Compute may run on different threads at once (they touch
// different state); each of them, and Finish, one call at a time. The
// backend and the problem must outlive the computation.
class LossComputation {
 public:
  LossComputation(Backend& backend, const IndexerKlProblem& problem);

  // Whether the problem takes a counting pass first.
  bool needs_counting() const { return !problem_.denominator.has_value(); }

  // Checks that rows [row_begin, row_begin + num_rows), of the counting pass
  // or not, are the block that comes next, and books it. INVALID_ARGUMENT
  // naming row_begin, num_rows or counting otherwise.
  absl::StatusOr<AdmittedBlock> Admit(int64_t row_begin, int64_t num_rows,
                                      bool counting);

  // Computes an admitted block from `data` (its rows' tensors), writing its
  // gradient and row KL into `outputs` unless it is a counting block, which
  // writes nothing. Blocks must be computed in the order they were admitted
  // (FAILED_PRECONDITION otherwise). Value errors in the data are
  // INVALID_ARGUMENT; so are output buffers too small for the block.
  absl::Status Compute(const AdmittedBlock& block, const RowData& data,
                       const LossOutputs& outputs);

  // The result once every admitted block is computed. INVALID_ARGUMENT
  // naming row_begin, num_rows when the admitted blocks did not cover every
  // pass, and naming counting when the gradient pass's rows had another N
  // than the counting pass's (the client sent other data the second time).
  absl::StatusOr<IndexerKlResult> Finish() const;

 private:
  Backend& backend_;
  const IndexerKlProblem& problem_;

  // Admit's state: the next block's first row and pass.
  int64_t next_row_ = 0;
  bool next_counting_;

  // Compute's state: the next block to compute, and what it folds into.
  int64_t computed_row_ = 0;
  bool computed_counting_;
  LossAccumulator counted_;  // the counting pass
  LossAccumulator accumulator_;
  std::optional<int64_t> denominator_;  // N, once known
  double grad_scale_ = 0;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_LOSS_COMPUTATION_H_
