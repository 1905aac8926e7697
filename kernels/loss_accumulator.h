#ifndef KLSERVE_KERNELS_LOSS_ACCUMULATOR_H_
#define KLSERVE_KERNELS_LOSS_ACCUMULATOR_H_

#include <cstdint>

// Row results and their in-order fold. The totals are sums of doubles in row
// order, so any split of the rows into blocks, computed by any number of
// threads, gives the same bits.

namespace klserve {

// What one row contributes. Backends fill one per row.
struct RowResult {
  enum class Kind : uint8_t {
    kComputed,     // at least one valid key and a positive target
    kFullyMasked,  // no valid key
    kZeroTarget,   // valid keys, but the target is zero on all of them
  };
  Kind kind = Kind::kFullyMasked;
  double kl = 0;         // unscaled KL of the row
  double entropy_p = 0;  // filled when diagnostics are requested
  double entropy_q = 0;
  double recall = 0;
};

class LossAccumulator {
 public:
  // `row_valid` is the client's row_valid for this row (true when absent).
  void Add(const RowResult& row, bool row_valid);

  double kl_sum() const { return kl_sum_; }
  double entropy_p_sum() const { return entropy_p_sum_; }
  double entropy_q_sum() const { return entropy_q_sum_; }
  double recall_sum() const { return recall_sum_; }
  // Rows that contribute a KL: computed and row_valid.
  int64_t rows_counted() const { return rows_counted_; }
  // Rows with a valid key and a positive target, whatever row_valid says:
  // MEAN_VALID's N when the client gives no row_valid.
  int64_t rows_nonempty() const { return rows_nonempty_; }
  int64_t rows_fully_masked() const { return rows_fully_masked_; }
  int64_t rows_zero_target() const { return rows_zero_target_; }

 private:
  double kl_sum_ = 0;
  double entropy_p_sum_ = 0;
  double entropy_q_sum_ = 0;
  double recall_sum_ = 0;
  int64_t rows_counted_ = 0;
  int64_t rows_nonempty_ = 0;
  int64_t rows_fully_masked_ = 0;
  int64_t rows_zero_target_ = 0;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_LOSS_ACCUMULATOR_H_
