#include "kernels/cpu/row_scratch.h"

namespace klserve::cpu {

RowScratch& RowScratch::ForThisThread(const IndexerKlProblem& problem) {
  thread_local RowScratch scratch;
  scratch.Reserve(problem);
  return scratch;
}

void RowScratch::Reserve(const IndexerKlProblem& problem) {
  if (problem.K > slots_) {
    slots_ = problem.K;
    // Left uninitialised: every pass writes a slot before reading it.
    // Whole 4 KiB pages plus 5 cache lines per row.
    row_stride_ = (slots_ + 1023) / 1024 * 1024 + 5 * 16;
    rows_.reset(new float[kRows * row_stride_]);
    valid_.reset(new uint8_t[slots_]);
    ranked_.reset(new std::pair<float, int32_t>[slots_]);
  }
  if (problem.sparse && problem.S > keys_) {
    keys_ = problem.S;
    seen_.reset(new uint64_t[keys_]());  // zero: no mark is ever 0
  }
}

}  // namespace klserve::cpu
