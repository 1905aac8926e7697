#ifndef KLSERVE_KERNELS_LOSS_H_
#define KLSERVE_KERNELS_LOSS_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/problem.h"

// The whole-problem entry point and the result it returns.

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

// Caller-owned output buffers for a whole problem.
struct LossOutputs {
  // [B,T,K] in options.grad_dtype; required when options.want_grad.
  void* grad = nullptr;
  int64_t grad_byte_size = 0;
  // [B*T] per-row KL (unscaled, 0 for rows that do not count); required when
  // options.want_row_kl.
  double* row_kl = nullptr;
  int64_t row_kl_size = 0;
};

// Computes the loss, the gradient and the diagnostics of `problem`. Value
// errors in the data (NaN, infinities, bad indices) come back as
// INVALID_ARGUMENT; the output buffers then hold partial results. Thread-safe
// for concurrent calls on one backend.
absl::StatusOr<IndexerKlResult> ComputeIndexerKl(
    Backend& backend, const IndexerKlProblem& problem,
    const LossOutputs& outputs);

// The gradient's scale c / N (0 when N = 0).
double GradScale(const IndexerKlProblem& problem, int64_t denominator);

// Turns the folded rows into the result. `denominator` is N: the problem's
// when known, otherwise accumulator.rows_nonempty().
IndexerKlResult FinishLoss(const IndexerKlProblem& problem,
                           const LossAccumulator& accumulator,
                           int64_t denominator);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_LOSS_H_
