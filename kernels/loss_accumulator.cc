#include "kernels/loss_accumulator.h"

namespace klserve {

void LossAccumulator::Add(const RowResult& row, bool row_valid) {
  switch (row.kind) {
    case RowResult::Kind::kFullyMasked:
      ++rows_fully_masked_;
      return;
    case RowResult::Kind::kZeroTarget:
      ++rows_zero_target_;
      return;
    case RowResult::Kind::kComputed:
      break;
  }
  ++rows_nonempty_;
  if (!row_valid) return;
  ++rows_counted_;
  kl_sum_ += row.kl;
  entropy_p_sum_ += row.entropy_p;
  entropy_q_sum_ += row.entropy_q;
  recall_sum_ += row.recall;
}

}  // namespace klserve
