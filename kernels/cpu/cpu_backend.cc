#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/fold_rows.h"
#include "kernels/half.h"
#include "kernels/loss_computation.h"

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
    : pool_(num_threads), kernels_(cpu::KernelsFor(isa)) {
  // Each matrix product of the projections form runs on the pool thread
  // that calls it; the BLAS must not start threads of its own.
  openblas_set_num_threads(1);
}

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

namespace {

// d_index_key, which sums over query rows: the tiles' contributions added in
// tile order, whichever thread computed them and when, in double.
class OrderedKeyGradFold {
 public:
  OrderedKeyGradFold(int64_t size, int64_t row_width)
      : sum_(size, 0.0), width_(row_width) {}

  // Waits for tile `index`'s turn (every earlier tile has folded), adds
  // `partial` into batch entry b's rows (unless null), and passes the turn.
  void Fold(int64_t index, int64_t b, int64_t S,
            const cpu::KeyGradPartial* partial) {
    absl::MutexLock lock(&mu_);
    const auto turn = [this, index] {
      mu_.AssertReaderHeld();
      return next_ == index;
    };
    mu_.Await(absl::Condition(&turn));
    if (partial != nullptr) {
      for (int64_t e = 0; e < partial->count; ++e) {
        double* row = sum_.data() + (b * S + partial->keys[e]) * width_;
        const float* add = partial->rows.data() + e * width_;
        for (int64_t d = 0; d < width_; ++d) row[d] += add[d];
      }
    }
    ++next_;
  }

  // The sum in `dtype`.
  void Store(DType dtype, std::byte* out) const {
    for (size_t i = 0; i < sum_.size(); ++i) {
      const float v = static_cast<float>(sum_[i]);
      switch (dtype) {
        case DType::kBFloat16: {
          const uint16_t bits = FloatToBFloat16(v);
          std::memcpy(out + 2 * i, &bits, 2);
          break;
        }
        case DType::kFloat16: {
          const uint16_t bits = FloatToFloat16(v);
          std::memcpy(out + 2 * i, &bits, 2);
          break;
        }
        default:
          std::memcpy(out + 4 * i, &v, 4);
      }
    }
  }

 private:
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> sum_;
  const int64_t width_;
};

}  // namespace

absl::Status CpuBackend::ComputeProjections(const ProjectionsProblem& p,
                                            const ProjectionsOutputs& out,
                                            LossAccumulator& accumulator,
                                            int64_t& denominator) {
  const IndexerKlProblem& lp = p.logits;
  const int64_t num_rows = lp.num_rows();
  const auto release = [] { cpu::RowScratch::ReleaseExcessOfThisThread(); };

  // N, when it is the number of rows with a valid key: counted first, as the
  // gradient is written once, already scaled.
  if (lp.denominator) {
    denominator = *lp.denominator;
  } else {
    const int64_t chunks = std::min<int64_t>(
        num_rows, int64_t{pool_.num_threads()} * kChunksPerThread);
    std::vector<int64_t> counts(chunks, 0);
    FirstError error;
    pool_.ParallelFor(
        chunks,
        [&](int64_t chunk) {
          const int64_t begin = num_rows * chunk / chunks;
          const int64_t end = num_rows * (chunk + 1) / chunks;
          int64_t failed_row = 0;
          absl::Status status = kernels_.count_rows_with_keys(
              p, {begin, end}, counts[chunk], failed_row);
          if (!status.ok()) error.Offer(failed_row, std::move(status));
        },
        release);
    if (absl::Status status = error.status(); !status.ok()) return status;
    denominator = 0;
    for (int64_t c : counts) denominator += c;
  }

  const bool want_grad = lp.options.want_grad;
  const int64_t tile_rows =
      p.sparse() ? cpu::kSparseTileRows : cpu::kDenseTileRows;
  const int64_t tiles_per_entry = (p.T + tile_rows - 1) / tile_rows;
  std::vector<RowResult> results(num_rows);
  OrderedKeyGradFold key_grad(want_grad ? p.B * p.S * p.D_I : 0, p.D_I);
  FirstError error;
  const cpu::ProjectionTile tile_of_problem{
      .grad_scale = GradScale(lp, denominator), .want_grad = want_grad};
  pool_.ParallelFor(
      p.B * tiles_per_entry,
      [&](int64_t index) {
        cpu::ProjectionTile tile = tile_of_problem;
        tile.b = index / tiles_per_entry;
        tile.t_begin = index % tiles_per_entry * tile_rows;
        tile.t_end = std::min(p.T, tile.t_begin + tile_rows);
        const int64_t r0 = tile.b * p.T + tile.t_begin;
        cpu::KeyGradPartial partial;
        bool folds = false;
        if (!error.Beyond(r0)) {
          const cpu::ProjectionTileOutputs outputs{
              .results = results.data() + r0,
              .d_index_query = out.d_index_query,
              .d_index_weights = out.d_index_weights,
              .grad_dtype = lp.options.grad_dtype,
              .topk_indices = out.topk_indices,
              .key_grad = &partial};
          int64_t failed_row = 0;
          absl::Status status =
              kernels_.compute_projection_tile(p, tile, outputs, failed_row);
          folds = status.ok() && want_grad;
          if (!status.ok()) error.Offer(failed_row, std::move(status));
        }
        // Every tile takes its turn, computed or not, so that later tiles
        // never wait for one that will not come.
        key_grad.Fold(index, tile.b, p.S, folds ? &partial : nullptr);
      },
      release);
  if (absl::Status status = error.status(); !status.ok()) return status;
  if (want_grad) key_grad.Store(lp.options.grad_dtype, out.d_index_key);
  FoldRows(lp, 0, results, out.row_kl, accumulator);
  return absl::OkStatus();
}

}  // namespace klserve
