#include "kernels/loss.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace klserve {

double GradScale(const IndexerKlProblem& problem, int64_t denominator) {
  if (denominator == 0) return 0;
  return problem.options.scaling_factor / static_cast<double>(denominator);
}

IndexerKlResult FinishLoss(const IndexerKlProblem& problem,
                           const LossAccumulator& accumulator,
                           int64_t denominator) {
  IndexerKlResult result;
  result.denominator = denominator;
  result.kl_sum = accumulator.kl_sum();
  if (denominator > 0) {
    result.unscaled_loss =
        accumulator.kl_sum() / static_cast<double>(denominator);
    result.loss = problem.options.scaling_factor * result.unscaled_loss;
  }
  result.rows_counted = accumulator.rows_counted();
  result.rows_fully_masked = accumulator.rows_fully_masked();
  result.rows_zero_target = accumulator.rows_zero_target();
  if (problem.options.want_diagnostics) {
    Diagnostics& diagnostics = result.diagnostics.emplace();
    const int64_t counted = accumulator.rows_counted();
    if (counted > 0) {
      diagnostics.mean_entropy_p = accumulator.entropy_p_sum() / counted;
      diagnostics.mean_entropy_q = accumulator.entropy_q_sum() / counted;
    }
    if (problem.options.recall_k > 0) {
      diagnostics.topk_recall =
          counted > 0 ? accumulator.recall_sum() / counted : 0.0;
    }
  }
  return result;
}

absl::StatusOr<IndexerKlResult> ComputeIndexerKl(
    Backend& backend, const IndexerKlProblem& problem,
    const LossOutputs& outputs) {
  const IndexerKlOptions& options = problem.options;
  const int64_t rows = problem.num_rows();
  BlockOutputs block;
  if (options.want_grad) {
    const int64_t needed =
        rows * problem.row_length * DTypeSize(options.grad_dtype);
    if (outputs.grad == nullptr || outputs.grad_byte_size < needed) {
      return absl::InvalidArgumentError(
          absl::StrCat("grad: output buffer must hold ", needed, " bytes, got ",
                       outputs.grad == nullptr ? 0 : outputs.grad_byte_size));
    }
    block.grad = static_cast<std::byte*>(outputs.grad);
    block.grad_dtype = options.grad_dtype;
    block.grad_batch_stride = problem.T * problem.row_length;
    block.grad_row_stride = problem.row_length;
  }
  if (options.want_row_kl) {
    if (outputs.row_kl == nullptr || outputs.row_kl_size < rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("row_kl: output buffer must hold ", rows,
                       " values, got ", outputs.row_kl_size));
    }
    block.row_kl = outputs.row_kl;
  }
  const RowRange all{0, rows};

  int64_t denominator;
  if (problem.denominator) {
    denominator = *problem.denominator;
  } else {
    // MEAN_VALID without row_valid: N is known only after a pass over the
    // rows. Count first, so that the gradient is written once, already scaled
    // (rescaling a rounded BF16 gradient would round twice).
    LossAccumulator counting;
    BlockOutputs count_only;
    RETURN_IF_ERROR(
        backend.ComputeRows(problem, problem.rows, all, count_only, counting));
    denominator = counting.rows_nonempty();
  }
  block.grad_scale = GradScale(problem, denominator);
  LossAccumulator accumulator;
  RETURN_IF_ERROR(
      backend.ComputeRows(problem, problem.rows, all, block, accumulator));
  return FinishLoss(problem, accumulator, denominator);
}

}  // namespace klserve
