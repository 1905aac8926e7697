#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/fold_rows.h"

namespace klserve {
namespace {

// Chunks per thread: enough for causal rows of uneven cost to balance, few
// enough that per-chunk scratch stays negligible.
constexpr int64_t kChunksPerThread = 8;

// The error of the lowest failing row, whichever thread finds it first.
class FirstError {
 public:
  void Offer(int64_t row, absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (row < row_) {
      row_ = row;
      status_ = std::move(status);
    }
  }
  // Rows past a known error need not be computed.
  bool Beyond(int64_t row) {
    absl::MutexLock lock(&mu_);
    return row > row_;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  int64_t row_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

CpuBackend::CpuBackend(int num_threads, cpu::Isa isa)
    : pool_(num_threads), kernels_(cpu::KernelsFor(isa)) {}

std::string CpuBackend::device() const {
  return absl::StrCat(pool_.num_threads(), " threads, ",
                      cpu::IsaName(kernels_.isa), " kernels");
}

absl::Status CpuBackend::ComputeRows(const IndexerKlProblem& p,
                                     const RowData& data, RowRange rows,
                                     const BlockOutputs& out,
                                     LossAccumulator& accumulator) {
  const int64_t n = rows.size();
  if (n <= 0) return absl::OkStatus();
  std::vector<RowResult> results(n);
  FirstError error;
  const int64_t chunks =
      std::min<int64_t>(n, int64_t{pool_.num_threads()} * kChunksPerThread);
  pool_.ParallelFor(
      chunks,
      [&](int64_t chunk) {
        const int64_t begin = rows.begin + n * chunk / chunks;
        const int64_t end = rows.begin + n * (chunk + 1) / chunks;
        if (error.Beyond(begin)) return;
        int64_t failed_row = 0;
        absl::Status status = kernels_.compute_rows(
            p, data, {begin, end}, out, results.data() + (begin - rows.begin),
            failed_row);
        if (!status.ok()) error.Offer(failed_row, std::move(status));
      },
      // The chunks computed their rows in each thread's RowScratch.
      [] { cpu::RowScratch::ReleaseExcessOfThisThread(); });
  if (absl::Status status = error.status(); !status.ok()) return status;

  FoldRows(p, rows.begin, results, out.row_kl, accumulator);
  return absl::OkStatus();
}

}  // namespace klserve
