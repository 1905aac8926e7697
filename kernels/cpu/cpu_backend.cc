#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/row_convert.h"
#include "kernels/cpu/row_loss.h"
#include "kernels/cpu/row_passes.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/cpu/row_validity.h"

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

std::byte* GradRow(const BlockOutputs& out, int64_t r, int64_t T) {
  const int64_t b0 = out.grad_origin_row / T, t0 = out.grad_origin_row % T;
  const int64_t offset =
      (r / T - b0) * out.grad_batch_stride + (r % T - t0) * out.grad_row_stride;
  return out.grad + offset * DTypeSize(out.grad_dtype);
}

bool RowCounts(const IndexerKlProblem& p, int64_t r) {
  return p.row_valid == nullptr || p.row_valid[r] != std::byte{0};
}

// Row r + 1's target and scores, to be fetched while row r computes.
cpu::Prefetcher NextRow(const IndexerKlProblem& p, const RowData& data,
                        int64_t r) {
  return cpu::Prefetcher(data.target.Row(r + 1, p.T),
                         data.scores.Row(r + 1, p.T),
                         p.K * std::max(DTypeSize(data.target.dtype),
                                        DTypeSize(data.scores.dtype)));
}

absl::StatusOr<RowResult> ComputeRow(const IndexerKlProblem& p,
                                     const RowData& data, int64_t r,
                                     const BlockOutputs& out,
                                     cpu::Prefetcher& next,
                                     cpu::RowScratch& scratch) {
  absl::StatusOr<cpu::RowValidity> validity =
      cpu::BuildRowValidity(p, data, r, scratch);
  if (!validity.ok()) return validity.status();

  std::byte* grad_out = out.grad != nullptr ? GradRow(out, r, p.T) : nullptr;
  const bool counts = RowCounts(p, r);
  float* grad = nullptr;
  if (grad_out != nullptr && counts) {
    grad = cpu::IsDirectFloat(out.grad_dtype, grad_out)
               ? reinterpret_cast<float*>(grad_out)
               : scratch.grad();
  }
  absl::StatusOr<RowResult> result = cpu::ComputeRowLoss(
      p, data, r, *validity, static_cast<float>(out.grad_scale), grad, next,
      scratch);
  if (!result.ok()) return result;
  if (grad_out != nullptr) {
    if (!counts) {
      // row_valid false: no gradient under any reduction (all-zero bits in
      // every float dtype).
      std::memset(grad_out, 0, p.K * DTypeSize(out.grad_dtype));
    } else if (grad != reinterpret_cast<float*>(grad_out)) {
      cpu::StoreFloatRow(grad, p.K, out.grad_dtype, grad_out);
    }
  }
  return result;
}

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

std::string CpuBackend::device() const {
  const char* isa = cpu::kLanes == 16 ? "AVX-512" : cpu::kLanes == 8 ? "AVX2" : "SSE";
  return absl::StrCat(pool_.num_threads(), " threads, ", isa);
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
  pool_.ParallelFor(chunks, [&](int64_t chunk) {
    const int64_t begin = rows.begin + n * chunk / chunks;
    const int64_t end = rows.begin + n * (chunk + 1) / chunks;
    if (error.Beyond(begin)) return;
    cpu::RowScratch& scratch = cpu::RowScratch::ForThisThread(p);
    for (int64_t r = begin; r < end; ++r) {
      cpu::Prefetcher next =
          r + 1 < end ? NextRow(p, data, r) : cpu::Prefetcher();
      absl::StatusOr<RowResult> result =
          ComputeRow(p, data, r, out, next, scratch);
      if (!result.ok()) {
        error.Offer(r, result.status());
        return;
      }
      results[r - rows.begin] = *result;
    }
    cpu::FinishStreamingStores();
  });
  if (absl::Status status = error.status(); !status.ok()) return status;

  // Fold in row order: the totals then do not depend on the chunking.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows.begin + i;
    const bool counts = RowCounts(p, r);
    accumulator.Add(results[i], counts);
    if (out.row_kl != nullptr) {
      out.row_kl[i] = counts && results[i].kind == RowResult::Kind::kComputed
                          ? results[i].kl
                          : 0.0;
    }
  }
  return absl::OkStatus();
}

}  // namespace klserve
