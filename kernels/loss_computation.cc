#include "kernels/loss_computation.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace klserve {

IndexerKlResult LossResultOf(const IndexerKlProblem& problem,
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

LossComputation::LossComputation(Backend& backend,
                                 const IndexerKlProblem& problem)
    : backend_(backend),
      problem_(problem),
      next_counting_(needs_counting()),
      computed_counting_(needs_counting()),
      denominator_(problem.denominator) {
  if (denominator_) grad_scale_ = GradScale(problem_, *denominator_);
}

absl::StatusOr<AdmittedBlock> LossComputation::Admit(int64_t row_begin,
                                                     int64_t num_rows,
                                                     bool counting) {
  if (row_begin != next_row_) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_begin: blocks must come in order without gaps, "
                     "expected ",
                     next_row_, ", got ", row_begin));
  }
  const int64_t remaining = problem_.num_rows() - next_row_;
  if (num_rows < 1 || num_rows > remaining) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_rows: must be in [1, ", remaining,
                     "] (rows not yet sent), got ", num_rows));
  }
  if (counting != next_counting_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "counting: ",
        needs_counting()
            ? "MEAN_VALID without row_valid sends rows [0, B*T) twice, first "
              "with counting = true (the counting pass), then with counting "
              "= false; expected "
            : "this problem's N is known without counting, so its rows come "
              "once with counting = false; expected ",
        next_counting_ ? "the counting pass" : "the gradient pass", " at row ",
        row_begin, ", got counting = ", counting ? "true" : "false"));
  }
  const AdmittedBlock block{RowRange{row_begin, row_begin + num_rows},
                            counting};
  next_row_ = block.rows.end;
  if (counting && next_row_ == problem_.num_rows()) {
    next_row_ = 0;
    next_counting_ = false;
  }
  return block;
}

absl::Status LossComputation::Compute(const AdmittedBlock& block,
                                      const RowData& data,
                                      const LossOutputs& outputs) {
  const RowRange rows = block.rows;
  // A gradient block computed before the counting pass ends would be scaled
  // by an N not yet known.
  if (block.counting != computed_counting_ || rows.begin != computed_row_) {
    return absl::FailedPreconditionError(
        "LossComputation: blocks must be computed in the order they were "
        "admitted");
  }
  if (block.counting) {
    RETURN_IF_ERROR(
        backend_.ComputeRows(problem_, data, rows, BlockOutputs(), counted_));
    computed_row_ = rows.end;
    if (rows.end == problem_.num_rows()) {
      denominator_ = counted_.rows_nonempty();
      RETURN_IF_ERROR(CheckGradScale(problem_, *denominator_));
      grad_scale_ = GradScale(problem_, *denominator_);
      computed_row_ = 0;
      computed_counting_ = false;
    }
    return absl::OkStatus();
  }
  const IndexerKlOptions& options = problem_.options;
  BlockOutputs block_outputs;
  if (options.want_grad) {
    const int64_t needed =
        rows.size() * problem_.row_length * DTypeSize(options.grad_dtype);
    if (outputs.grad == nullptr || outputs.grad_byte_size < needed) {
      return absl::InvalidArgumentError(
          absl::StrCat("grad: output buffer must hold ", needed, " bytes, got ",
                       outputs.grad == nullptr ? 0 : outputs.grad_byte_size));
    }
    block_outputs.grad = static_cast<std::byte*>(outputs.grad);
    block_outputs.grad_dtype = options.grad_dtype;
    block_outputs.grad_origin_row = rows.begin;
    // The block's rows are contiguous whatever batch they belong to:
    // (b - b0) T K + (t - t0) K = (r - r0) K.
    block_outputs.grad_batch_stride = problem_.T * problem_.row_length;
    block_outputs.grad_row_stride = problem_.row_length;
  }
  block_outputs.grad_scale = grad_scale_;
  if (options.want_row_kl) {
    if (outputs.row_kl == nullptr || outputs.row_kl_size < rows.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("row_kl: output buffer must hold ", rows.size(),
                       " values, got ", outputs.row_kl_size));
    }
    block_outputs.row_kl = outputs.row_kl;
  }
  RETURN_IF_ERROR(
      backend_.ComputeRows(problem_, data, rows, block_outputs, accumulator_));
  computed_row_ = rows.end;
  return absl::OkStatus();
}

absl::StatusOr<IndexerKlResult> LossComputation::Finish() const {
  if (next_counting_ || next_row_ != problem_.num_rows()) {
    // With two passes, name the one that fell short: a stream that sent
    // its counting pass whole and stopped covered [0, 0) of the second.
    const char* pass = !needs_counting() ? ""
                       : next_counting_  ? " of the counting pass"
                                         : " of the gradient pass";
    return absl::InvalidArgumentError(absl::StrCat(
        "row_begin, num_rows: the blocks", pass, " covered rows [0, ",
        next_row_, ") of the B*T=", problem_.num_rows(), " rows",
        needs_counting() && !next_counting_
            ? "; after the counting pass, every row comes again"
            : ""));
  }
  if (computed_counting_ || computed_row_ != problem_.num_rows()) {
    return absl::FailedPreconditionError(
        "LossComputation: Finish before every admitted block was computed");
  }
  // The two passes must have carried the same rows: the gradient was scaled
  // by the counting pass's N.
  if (needs_counting() && accumulator_.rows_nonempty() != *denominator_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "counting: the counting pass found ", *denominator_,
        " rows with a valid key and a positive target, the gradient pass ",
        accumulator_.rows_nonempty(),
        "; both passes must carry the same rows"));
  }
  return LossResultOf(problem_, accumulator_, *denominator_);
}

}  // namespace klserve
