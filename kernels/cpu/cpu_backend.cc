#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/return_memory.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/fold_rows.h"

namespace klserve {
namespace {

// Chunks per thread: enough for causal rows of uneven cost to balance, few
// enough that per-chunk scratch stays negligible.
constexpr int64_t kChunksPerThread = 8;
// The rows whose results ComputeRows holds at once.
constexpr int64_t kRowsPerFold = int64_t{1} << 16;
// The slots whose validity one chunk of a projections count builds.
constexpr int64_t kCountChunkSlots = int64_t{1} << 22;

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
    : blas_(cpu::LoadBlas()),
      pool_(num_threads),
      kernels_(cpu::KernelsFor(isa)) {}

std::string CpuBackend::device() const {
  // The BLAS kernels too: a replica that runs others answers the
  // projections form with other bits (docs/blas.md).
  return absl::StrCat(pool_.num_threads(),
                      pool_.num_threads() == 1 ? " thread, " : " threads, ",
                      cpu::IsaName(kernels_.isa), " kernels",
                      blas_.ok() ? ", OpenBLAS " + cpu::BlasCoreName() : "");
}

absl::Status CpuBackend::ComputeRows(const IndexerKlProblem& p,
                                     const RowData& data, RowRange rows,
                                     const BlockOutputs& out,
                                     LossAccumulator& accumulator) {
  // The rows' results (a RowResult, 40 bytes a row) are held for
  // kRowsPerFold rows at a time and folded in row order, so the bits do not
  // depend on it: a block of 16 million one-slot rows had held 640 MiB.
  std::vector<RowResult> results;
  for (int64_t first = rows.begin; first < rows.end; first += kRowsPerFold) {
    const RowRange part{first, std::min(rows.end, first + kRowsPerFold)};
    const int64_t n = part.size();
    results.assign(n, RowResult());
    FirstError error;
    const int64_t chunks =
        std::min<int64_t>(n, int64_t{pool_.num_threads()} * kChunksPerThread);
    pool_.ParallelFor(
        chunks,
        [&](int64_t chunk) {
          const int64_t begin = part.begin + n * chunk / chunks;
          const int64_t end = part.begin + n * (chunk + 1) / chunks;
          if (error.Beyond(begin)) return;
          int64_t failed_row = 0;
          absl::Status status = kernels_.compute_rows(
              p, data, {begin, end}, out, results.data() + (begin - part.begin),
              failed_row);
          if (!status.ok()) error.Offer(failed_row, std::move(status));
        },
        // The chunks computed their rows in each thread's RowScratch.
        [] { cpu::RowScratch::ReleaseExcessOfThisThread(); });
    if (absl::Status status = error.status(); !status.ok()) return status;
    FoldRows(p, part.begin, results,
             out.row_kl == nullptr ? nullptr
                                   : out.row_kl + (part.begin - rows.begin),
             accumulator);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CpuBackend::CountProjectionRowsWithKeys(
    const ProjectionsProblem& p, const ProjectionsRowData& data, RowRange rows,
    const StopCheck& stop) {
  if (!blas_.ok()) return blas_;
  const int64_t n = rows.size();
  if (n <= 0) return 0;
  // A row's validity costs up to its slots (S, or the client's K): chunks
  // of about kCountChunkSlots slots, each asking `stop` first, so that a
  // count over many rows of many keys ends soon after its caller has gone.
  const IndexerKlProblem& counted = p.server_topk ? *p.selection : p.logits;
  const int64_t per_chunk = std::max<int64_t>(
      1, kCountChunkSlots / std::max<int64_t>(counted.row_length, 1));
  const int64_t chunks = n / per_chunk + (n % per_chunk != 0);
  std::atomic<int64_t> count{0};
  FirstError error;
  pool_.ParallelFor(
      chunks,
      [&](int64_t chunk) {
        const int64_t begin = rows.begin + chunk * per_chunk;
        if (error.Beyond(begin)) return;
        const int64_t end = std::min(rows.end, begin + per_chunk);
        int64_t failed_row = begin, chunk_count = 0;
        absl::Status status = stop ? stop() : absl::OkStatus();
        if (status.ok()) {
          status = kernels_.count_rows_with_keys(p, data, {begin, end},
                                                 chunk_count, failed_row);
        }
        if (!status.ok()) {
          error.Offer(failed_row, std::move(status));
          return;
        }
        count.fetch_add(chunk_count, std::memory_order_relaxed);
      },
      [] { cpu::RowScratch::ReleaseExcessOfThisThread(); });
  if (absl::Status status = error.status(); !status.ok()) return status;
  return count.load();
}

absl::Status CpuBackend::ComputeProjectionRows(
    const ProjectionsProblem& p, const ProjectionsRowData& data, RowRange rows,
    const ProjectionsRowOutputs& out, RowResult* results, KeyGradFold& key_grad,
    const StopCheck& stop) {
  if (!blas_.ok()) return blas_;
  // The tiles of `rows`, numbered as KeyGradFold counts them: tile i of
  // batch entry b is b * per_entry + i.
  const int64_t per_entry = (p.T + p.tile_rows - 1) / p.tile_rows;
  const auto tile_number = [&](int64_t r) {
    return r / p.T * per_entry + r % p.T / p.tile_rows;
  };
  const int64_t first = tile_number(rows.begin);
  const int64_t count = tile_number(rows.end - 1) + 1 - first;
  FirstError error;
  pool_.ParallelFor(
      count,
      [&](int64_t index) {
        const int64_t number = first + index;
        cpu::ProjectionTile tile{.grad_scale = out.grad_scale,
                                 .want_grad = out.want_grad,
                                 .stop = stop ? &stop : nullptr};
        tile.b = number / per_entry;
        tile.t_begin = number % per_entry * p.tile_rows;
        tile.t_end = std::min(p.T, tile.t_begin + p.tile_rows);
        const int64_t r0 = tile.b * p.T + tile.t_begin;
        KeyGradPartial partial;
        bool folds = false;
        if (!error.Beyond(r0)) {
          absl::Status status = stop ? stop() : absl::OkStatus();
          int64_t failed_row = r0;
          if (status.ok()) {
            const cpu::ProjectionTileOutputs outputs{
                .results = results + (r0 - rows.begin),
                .origin_row = rows.begin,
                .d_index_query = out.d_index_query,
                .d_index_weights = out.d_index_weights,
                .grad_dtype = out.grad_dtype,
                .topk_indices = out.topk_indices,
                .key_grad = &partial};
            status = kernels_.compute_projection_tile(p, data, tile, outputs,
                                                      failed_row);
            folds = status.ok() && out.want_grad;
          }
          if (!status.ok()) error.Offer(failed_row, std::move(status));
        }
        // Every tile takes its turn, computed or not, so that later tiles
        // never wait for one that will not come.
        key_grad.Fold(number, tile.b, folds ? &partial : nullptr);
      },
      [this] {
        cpu::RowScratch::ReleaseExcessOfThisThread();
        kernels_.release_projection_scratch();
      });
  // Every thread has freed its tiles' buffers by now; freed, they would
  // otherwise stay with the allocator (tcmalloc keeps what it frees), and a
  // wide request's gigabytes must not outlive it. Once for all threads: the
  // allocator's free memory is the process's.
  const int64_t bytes = p.thread_scratch().bytes;
  if (bytes > cpu::RowScratch::kRetainedBytes) {
    int64_t all = 0;
    if (__builtin_mul_overflow(bytes, pool_.num_threads(), &all)) {
      all = std::numeric_limits<int64_t>::max();
    }
    cpu::ReturnFreedMemory(all);
  }
  return error.status();
}

}  // namespace klserve
