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

  float* target() { return target_.get(); }            // a converted target row
  float* next_target() { return next_target_.get(); }  // the next head's
  float* scores() { return scores_.get(); }  // the converted scores row
  float* w() { return w_.get(); }            // target weights
  float* e() { return e_.get(); }            // exponentials of the row
  float* grad() { return grad_.get(); }      // gradient before conversion
  uint8_t* valid() { return valid_.get(); }
  std::pair<float, int32_t>* ranked() { return ranked_.get(); }  // recall

  // Sparse duplicate check: a fresh mark for the next row, and the per-key
  // marks (seen[key] == mark once the row named the key).
  uint64_t NextRowMark() { return ++mark_; }
  uint64_t* seen() { return seen_.get(); }

 private:
  void Reserve(const IndexerKlProblem& problem);

  int64_t slots_ = 0;
  int64_t keys_ = 0;
  std::unique_ptr<float[]> target_, next_target_, scores_, w_, e_, grad_;
  std::unique_ptr<uint8_t[]> valid_;
  std::unique_ptr<std::pair<float, int32_t>[]> ranked_;
  std::unique_ptr<uint64_t[]> seen_;
  uint64_t mark_ = 0;
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
