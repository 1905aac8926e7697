#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/device_buffers.h"
#include "kernels/cuda/device_row_result.h"
#include "kernels/cuda/row_fold.h"
#include "kernels/cuda/row_kernel.h"
#include "kernels/cuda/row_pipeline.h"
#include "kernels/row_key_set.h"
#include "kernels/status_macros.h"
#include "kernels/topk_check.h"

namespace klserve {
namespace {

using cuda::CudaStatus;
using cuda::DeviceRowResult;
using cuda::RowPipeline;

// Pipelines lent to concurrent calls; a call beyond this many waits for one.
constexpr int kMaxPipelines = 4;

// The pipelines of one backend: created on demand, up to kMaxPipelines,
// and kept (with their grown buffers) for later calls.
class PipelinePool {
 public:
  explicit PipelinePool(int device) : device_(device) {}

  ~PipelinePool() {
    cudaSetDevice(device_);
    absl::MutexLock lock(&mu_);
    free_.clear();
  }

  // A pipeline for this call; the current device must be this pool's.
  absl::StatusOr<std::unique_ptr<RowPipeline>> Acquire() {
    absl::MutexLock lock(&mu_, absl::Condition(this, &PipelinePool::CanLend));
    if (!free_.empty()) {
      std::unique_ptr<RowPipeline> pipeline = std::move(free_.back());
      free_.pop_back();
      return pipeline;
    }
    absl::StatusOr<std::unique_ptr<RowPipeline>> pipeline =
        RowPipeline::Create();
    if (pipeline.ok()) ++created_;
    return pipeline;
  }

  void Release(std::unique_ptr<RowPipeline> pipeline) {
    absl::MutexLock lock(&mu_);
    free_.push_back(std::move(pipeline));
  }

 private:
  bool CanLend() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !free_.empty() || created_ < kMaxPipelines;
  }

  const int device_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<RowPipeline>> free_ ABSL_GUARDED_BY(mu_);
  int created_ ABSL_GUARDED_BY(mu_) = 0;
};

// Returns its pipeline to the pool on every exit.
class PipelineLease {
 public:
  PipelineLease(PipelinePool& pool, std::unique_ptr<RowPipeline> pipeline)
      : pool_(pool), pipeline_(std::move(pipeline)) {}
  ~PipelineLease() { pool_.Release(std::move(pipeline_)); }
  RowPipeline& operator*() { return *pipeline_; }

 private:
  PipelinePool& pool_;
  std::unique_ptr<RowPipeline> pipeline_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const cudaDeviceProp& properties)
      : device_(device),
        description_(absl::StrCat(
            properties.name, ", sm_", properties.major, properties.minor, ", ",
            std::llround(static_cast<double>(properties.totalGlobalMem) /
                         (int64_t{1} << 30)),
            " GiB")),
        pool_(device) {}

  std::string_view name() const override { return "cuda"; }
  std::string device() const override { return description_; }
  int threads() const override { return 1; }
  absl::Status ComputeRows(const IndexerKlProblem& problem, const RowData& data,
                           RowRange rows, const BlockOutputs& outputs,
                           LossAccumulator& accumulator) override;

 private:
  const int device_;
  const std::string description_;
  PipelinePool pool_;
};

absl::Status CudaBackend::ComputeRows(const IndexerKlProblem& p,
                                      const RowData& data, RowRange rows,
                                      const BlockOutputs& outputs,
                                      LossAccumulator& accumulator) {
  // The device kernels know no per-row key bounds: refused rather than
  // computed without them (--backend=auto serves such problems on a CPU
  // backend instead, server/service/backend_selection.h).
  if (p.key_start != nullptr) {
    return absl::UnimplementedError(
        "key_start: per-row key bounds are not served by the CUDA backend "
        "yet (--backend=auto or --backend=cpu serves them), got key_start "
        "and key_end");
  }
  if (rows.size() <= 0) return absl::OkStatus();

  // The index rule (no key twice), on the host and in row order before any
  // launch: within a row it comes before the value rules (as on the CPU).
  // Rows from the first bad one on are not
  // computed: that row's error is reported unless a lower row has another.
  RowRange device_rows = rows;
  absl::Status index_error;
  if (p.sparse()) {
    RowKeySet keys;
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      index_error = CheckTopkRow(data.indices.Row(r, p.T), p.row_length, p.S,
                                 r / p.T, r % p.T, keys);
      if (!index_error.ok()) {
        device_rows.end = r;
        break;
      }
    }
  }

  std::vector<DeviceRowResult> results;
  if (device_rows.size() > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    absl::StatusOr<std::unique_ptr<RowPipeline>> pipeline = pool_.Acquire();
    if (!pipeline.ok()) return pipeline.status();
    PipelineLease lease(pool_, *std::move(pipeline));
    RETURN_IF_ERROR((*lease).Run(p, data, device_rows, outputs, results));
  }
  RETURN_IF_ERROR(cuda::FirstRowError(p, data, rows.begin, results));
  RETURN_IF_ERROR(index_error);
  // Fold in row order: the totals then do not depend on the blocking.
  cuda::FoldRows(p, rows.begin, results, outputs.row_kl, accumulator);
  return absl::OkStatus();
}

// How many CUDA devices this process can use (at least one), or
// FAILED_PRECONDITION saying why none.
absl::StatusOr<int> UsableDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // leave no error behind for later calls
    // Without any NVIDIA driver the runtime reports "driver version is
    // insufficient", which reads as "upgrade it": say what it means.
    return absl::FailedPreconditionError(
        error == cudaErrorInsufficientDriver || error == cudaErrorNoDevice
            ? absl::StrCat(
                  "no NVIDIA driver or GPU found (expected on a machine "
                  "without a GPU; with one, install or update the "
                  "driver: CUDA says \"",
                  cudaGetErrorString(error), "\")")
            : absl::StrCat("no CUDA device: ", cudaGetErrorString(error)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("no CUDA device: none found");
  }
  return count;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device_ordinal) {
  ASSIGN_OR_RETURN(const int count, UsableDeviceCount());
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device_ordinal, ": no such device (",
                     count, " found)"));
  }
  const auto failed = [&](absl::string_view what, cudaError_t error) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device_ordinal, ": ", what, ": ",
                     cudaGetErrorString(error)));
  };
  if (cudaError_t error = cudaSetDevice(device_ordinal); error != cudaSuccess) {
    return failed("cannot select it", error);
  }
  cudaDeviceProp properties;
  if (cudaError_t error = cudaGetDeviceProperties(&properties, device_ordinal);
      error != cudaSuccess) {
    return failed("cannot read its properties", error);
  }
  // Creates the context: a device that is busy elsewhere (exclusive mode) or
  // broken says so here rather than at the first request.
  if (cudaError_t error = cudaFree(nullptr); error != cudaSuccess) {
    return failed("cannot start a context", error);
  }
  if (cudaError_t error = cuda::CheckRowKernelImage(); error != cudaSuccess) {
    return failed(absl::StrCat("this build has no code for ", properties.name,
                               " (sm_", properties.major, properties.minor,
                               "; add it to CMAKE_CUDA_ARCHITECTURES)"),
                  error);
  }
  return std::make_unique<CudaBackend>(device_ordinal, properties);
}

}  // namespace klserve
