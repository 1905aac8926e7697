#ifndef KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
#define KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "kernels/problem.h"
#include "kernels/row_key_set.h"

namespace klserve::cpu {

// The heads' softmaxes (the per-head target) are summed in float32
// kHeadsPerFloatSum heads at a time, and those blocks in float64. One float32
// sum of every head stagnates as it grows: at 2^20 heads the loss was off by
// a relative 1.8e-3. Blocked, the error stays what 64 heads give whatever H,
// and up to 64 heads the bits are those of the one sum. The float64 pass
// runs once per 64 heads.
inline constexpr int64_t kHeadsPerFloatSum = 64;

// Buffers one thread reuses for every row it computes. Each thread keeps its
// own (ForThisThread), grown to the widest rows it has met, so nothing is
// allocated per row and, once warm, nothing per request either. What a wide
// request grew past kRetainedBytes is freed when the thread's part of that
// computation ends (ReleaseExcessOfThisThread), so that one wide request does
// not leave every compute thread holding its rows.
class RowScratch {
 public:
  // The scratch a thread keeps between computations: rows of up to ~25K
  // slots (41 bytes a slot, 8 more past 64 heads, and up to 32 more for a
  // sparse row's key set; the benchmark's dense S = 4096 takes 167 KiB). A
  // wider row brings at least 4 bytes of input per slot, so growing its scratch
  // again per request costs little beside reading it.
  static constexpr int64_t kRetainedBytes = int64_t{1} << 20;

  // This thread's scratch, grown to fit `problem`.
  static RowScratch& ForThisThread(const IndexerKlProblem& problem);
  // Frees this thread's scratch if it holds more than kRetainedBytes. For
  // when the thread has computed its last rows of a request.
  static void ReleaseExcessOfThisThread();

  float* target() { return row(0); }       // a converted target row
  float* next_target() { return row(1); }  // the next head's
  float* scores() { return row(2); }       // the converted scores row
  float* w() { return row(3); }            // target weights
  float* e() { return row(4); }            // exponentials of the row
  float* previous_e() { return row(5); }   // the previous head's
  float* grad() { return row(6); }         // gradient before conversion
  float* maxtext_g() { return row(7); }    // MAXTEXT's -p / (q + eps)
  // The float64 sums of the heads' blocks (kHeadsPerFloatSum), made on
  // first use: only a target of more than 64 heads needs them.
  double* head_sums();
  uint8_t* valid() { return valid_.get(); }
  std::pair<float, int32_t>* ranked() { return ranked_.get(); }  // recall

  RowKeySet& row_keys() { return row_keys_; }  // sparse duplicate check

  // What the buffers hold, in bytes.
  int64_t bytes() const;
  // At most what they grow to for rows of `slots` slots, with the sparse
  // duplicate check's key set or without (the dense stage has none), and
  // without the heads' float64 sums.
  static int64_t BytesFor(int64_t slots, bool sparse);
  // At most what they grow to for `problem`'s rows, the heads' sums
  // included (past kHeadsPerFloatSum heads).
  static int64_t BytesFor(const IndexerKlProblem& problem);

 private:
  void Reserve(const IndexerKlProblem& problem);
  void Release();

  static constexpr int kRows = 8;
  float* row(int i) { return rows_.get() + i * row_stride_; }
  // The floats between rows for `slots` slots: whole 4 KiB pages plus 5
  // cache lines.
  static int64_t StrideFor(int64_t slots) {
    return (slots + 1023) / 1024 * 1024 + 5 * 16;
  }
  static constexpr int64_t kPerSlotBytes =
      sizeof(uint8_t) + sizeof(std::pair<float, int32_t>);

  int64_t slots_ = 0;
  // The float rows, carved from one block at a stride that is not a multiple
  // of 4 KiB: a store to one row and a load from another at the same index
  // would otherwise look dependent to the CPU (4K aliasing), stalling the
  // loops that read one row while writing the next.
  std::unique_ptr<float[]> rows_;
  int64_t row_stride_ = 0;
  std::unique_ptr<double[]> head_sums_;  // slots_ of them, or none yet
  std::unique_ptr<uint8_t[]> valid_;
  std::unique_ptr<std::pair<float, int32_t>[]> ranked_;
  RowKeySet row_keys_;
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
