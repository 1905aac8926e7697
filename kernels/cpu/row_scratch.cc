#include "kernels/cpu/row_scratch.h"

#include "kernels/cpu/return_memory.h"

namespace klserve::cpu {
namespace {

RowScratch& ThisThreads() {
  thread_local RowScratch scratch;
  return scratch;
}

}  // namespace

RowScratch& RowScratch::ForThisThread(const IndexerKlProblem& problem) {
  RowScratch& scratch = ThisThreads();
  scratch.Reserve(problem);
  return scratch;
}

void RowScratch::ReleaseExcessOfThisThread() {
  RowScratch& scratch = ThisThreads();
  const int64_t bytes = scratch.bytes();
  if (bytes > kRetainedBytes) {
    scratch.Release();
    ReturnFreedMemory(bytes);
  }
}

int64_t RowScratch::bytes() const {
  return kRows * row_stride_ * int64_t{sizeof(float)} + slots_ * kPerSlotBytes +
         (head_sums_ != nullptr ? slots_ * int64_t{sizeof(double)} : 0) +
         row_keys_.bytes();
}

double* RowScratch::head_sums() {
  if (head_sums_ == nullptr) head_sums_.reset(new double[slots_]);
  return head_sums_.get();
}

int64_t RowScratch::BytesFor(int64_t slots, bool sparse) {
  return kRows * StrideFor(slots) * int64_t{sizeof(float)} +
         slots * kPerSlotBytes + (sparse ? RowKeySet::MaxBytesFor(slots) : 0);
}

int64_t RowScratch::BytesFor(const IndexerKlProblem& problem) {
  const int64_t head_sums = problem.H > kHeadsPerFloatSum
                                ? problem.row_length * int64_t{sizeof(double)}
                                : 0;
  return BytesFor(problem.row_length, problem.sparse()) + head_sums;
}

void RowScratch::Reserve(const IndexerKlProblem& problem) {
  if (problem.row_length > slots_) {
    slots_ = problem.row_length;
    // Left uninitialised: every pass writes a slot before reading it.
    row_stride_ = StrideFor(slots_);
    rows_.reset(new float[kRows * row_stride_]);
    head_sums_.reset();  // made again, this wide, if needed
    valid_.reset(new uint8_t[slots_]);
    ranked_.reset(new std::pair<float, int32_t>[slots_]);
  }
}

void RowScratch::Release() {
  slots_ = 0;
  row_stride_ = 0;
  rows_.reset();
  head_sums_.reset();
  valid_.reset();
  ranked_.reset();
  row_keys_.Release();
}

}  // namespace klserve::cpu
