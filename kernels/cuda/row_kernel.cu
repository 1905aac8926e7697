// The row kernel: one block per row, its phases in the CPU backend's order
// (validity, target, scores, loss, diagnostics, gradient). Every decision
// that ends a row early is taken on block-reduced values, so all threads of
// a block take it together.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/device_row_result.h"
#include "kernels/cuda/row_io.cuh"
#include "kernels/cuda/row_kernel.h"
#include "kernels/cuda/row_loss.cuh"
#include "kernels/cuda/row_target.cuh"
#include "kernels/cuda/row_validity.cuh"
#include "kernels/cuda/topk_recall.cuh"
#include "kernels/loss_accumulator.h"

namespace klserve::cuda {
namespace {

constexpr double kLn2 = 0.693147180559945309417232121458176568;

__host__ __device__ constexpr uint8_t KindCode(RowResult::Kind kind) {
  return static_cast<uint8_t>(kind);
}

__device__ bool RowCounts(const RowKernelParams& p, int64_t r) {
  if (p.row_valid == nullptr) return true;
  const int64_t b = r / p.T, t = r % p.T;
  return p.row_valid[(b - p.batch_begin) * p.T + t] != 0;
}

// Row i of the chunk. Every thread returns the same result.
template <typename TT, typename TS>
__device__ DeviceRowResult ComputeRow(const RowKernelParams& p, int64_t i) {
  DeviceRowResult result = {};
  const int64_t r = p.row_begin + i;
  const RowSlots slots = BuildRowSlots(p, i, r);

  RowTarget<TT> target;
  const bool target_ok = p.per_head
                             ? PerHeadTarget(p, i, slots, target, result)
                             : AggregatedTarget(p, i, slots, target, result);
  if (!target_ok) return result;

  const TS* I = static_cast<const TS*>(p.scores) + i * p.K;
  const bool has_mass = slots.count > 0 && !target.zero;
  const ScoreScan scan = ScanScores(p, I, slots, target, has_mass);
  if (scan.first_bad != kNoSlot) {
    result.error = static_cast<uint8_t>(RowError::kScoresNotFinite);
    result.error_slot = scan.first_bad;
    return result;
  }
  const float m = scan.max;
  if (slots.count > 0 && m == -kInf) {
    result.error = static_cast<uint8_t>(RowError::kScoresAllMinusInf);
    return result;
  }
  // Rows without a KL stop before any exp (with no valid key the maximum is
  // -inf, and -inf - (-inf) would be NaN).
  if (!has_mass) {
    result.kind = KindCode(slots.count == 0 ? RowResult::Kind::kFullyMasked
                                            : RowResult::Kind::kZeroTarget);
    if (p.grad != nullptr) {
      WriteGrad<TS, TT>(p, i, I, slots, target, nullptr, 0.0f);
    }
    return result;
  }
  if (!p.maxtext && scan.first_minus_inf_mass != kNoSlot) {
    result.error = static_cast<uint8_t>(RowError::kMinusInfWithMass);
    result.error_slot = scan.first_minus_inf_mass;
    return result;
  }

  const ExpSums sums = ExpScores(I, slots, m, p.diagnostics);
  const double log_z = log(target.z);
  const double log_l = log(sums.l);
  const double sum_w_log_w =
      kLn2 * scan.sum_w_exponent + scan.sum_w_mantissa_log;
  const RowDistributions d{m, static_cast<float>(1.0 / sums.l),
                           static_cast<float>(1.0 / target.z)};
  result.kind = KindCode(RowResult::Kind::kComputed);
  float sum_qg = 0.0f;
  if (!p.maxtext) {
    // sum_s p_s (log p_s - log q_s) with log p = log w - log z and
    // log q = (I - m) - log L, expanded into the row sums.
    result.kl = (sum_w_log_w - scan.sum_w * log_z -
                 (scan.sum_w_scores - static_cast<double>(m) * scan.sum_w) +
                 scan.sum_w * log_l) /
                target.z;
  } else {
    const MaxTextSums maxtext = MaxTextTerms(I, slots, target, d);
    result.kl = maxtext.kl;
    sum_qg = static_cast<float>(maxtext.sum_qg);
  }
  if (p.diagnostics) {
    result.entropy_p = (scan.sum_w * log_z - sum_w_log_w) / target.z;
    result.entropy_q = log_l - sums.e_d / sums.l;
    if (p.recall_k > 0) {
      result.recall = TopkRecall(I, slots, target, p.recall_k);
    }
  }
  if (p.grad != nullptr) {
    // Rows whose row_valid is false get no gradient under any reduction.
    WriteGrad<TS, TT>(p, i, I, slots, target, RowCounts(p, r) ? &d : nullptr,
                      sum_qg);
  }
  return result;
}

template <typename TT, typename TS>
__global__ void __launch_bounds__(kThreads) RowKernel(const RowKernelParams p) {
  const DeviceRowResult result = ComputeRow<TT, TS>(p, blockIdx.x);
  if (threadIdx.x == 0) p.results[blockIdx.x] = result;
}

template <typename TT, typename TS>
cudaError_t Launch(const RowKernelParams& p, cudaStream_t stream) {
  RowKernel<TT, TS><<<static_cast<unsigned>(p.n), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// The kernel for the scores' dtype, the target's being TT.
template <typename TT>
cudaError_t LaunchForScores(const RowKernelParams& p, cudaStream_t stream) {
  switch (p.scores_dtype) {
    case DType::kFloat32:
      return Launch<TT, float>(p, stream);
    case DType::kBFloat16:
      return Launch<TT, __nv_bfloat16>(p, stream);
    case DType::kFloat16:
      return Launch<TT, __half>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchRowKernel(const RowKernelParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  switch (p.target_dtype) {
    case DType::kFloat32:
      return LaunchForScores<float>(p, stream);
    case DType::kBFloat16:
      return LaunchForScores<__nv_bfloat16>(p, stream);
    case DType::kFloat16:
      return LaunchForScores<__half>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t CheckRowKernelImage() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, RowKernel<float, float>);
}

}  // namespace klserve::cuda
