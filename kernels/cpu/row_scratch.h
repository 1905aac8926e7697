#ifndef KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
#define KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "kernels/problem.h"

namespace klserve::cpu {

// Buffers one thread reuses for every row it computes. They only grow, and
// each thread keeps its own (ForThisThread), so nothing is allocated per row
// and, once warm, nothing per request either.
class RowScratch {
 public:
  // This thread's scratch, grown to fit `problem`.
  static RowScratch& ForThisThread(const IndexerKlProblem& problem);

  float* target() { return row(0); }       // a converted target row
  float* next_target() { return row(1); }  // the next head's
  float* scores() { return row(2); }       // the converted scores row
  float* w() { return row(3); }            // target weights
  float* e() { return row(4); }            // exponentials of the row
  float* previous_e() { return row(5); }   // the previous head's
  float* grad() { return row(6); }         // gradient before conversion
  float* maxtext_g() { return row(7); }    // MAXTEXT's -p / (q + eps)
  uint8_t* valid() { return valid_.get(); }
  std::pair<float, int32_t>* ranked() { return ranked_.get(); }  // recall

  // Sparse duplicate check: a fresh mark for the next row, and the per-key
  // marks (seen[key] == mark once the row named the key).
  uint64_t NextRowMark() { return ++mark_; }
  uint64_t* seen() { return seen_.get(); }

 private:
  void Reserve(const IndexerKlProblem& problem);

  static constexpr int kRows = 8;
  float* row(int i) { return rows_.get() + i * row_stride_; }

  int64_t slots_ = 0;
  int64_t keys_ = 0;
  // The float rows, carved from one block at a stride that is not a multiple
  // of 4 KiB: a store to one row and a load from another at the same index
  // would otherwise look dependent to the CPU (4K aliasing), stalling the
  // loops that read one row while writing the next.
  std::unique_ptr<float[]> rows_;
  int64_t row_stride_ = 0;
  std::unique_ptr<uint8_t[]> valid_;
  std::unique_ptr<std::pair<float, int32_t>[]> ranked_;
  std::unique_ptr<uint64_t[]> seen_;
  uint64_t mark_ = 0;
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
