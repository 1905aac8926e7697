#ifndef KLSERVE_KERNELS_CUDA_ROW_TARGET_CUH_
#define KLSERVE_KERNELS_CUDA_ROW_TARGET_CUH_

// The target distribution of one row on the device, p = w / z with w zero on
// invalid slots: the device twin of the CPU backend's row_target.cc. Per-head
// logits give w = sum_h P_h (z = H, MAXTEXT H + 1e-8), each P_h a softmax
// over the valid slots; head-aggregated weights give w = X (z = sum of the
// valid X, MAXTEXT + 1e-8). The checks and their order are the CPU's.

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/device_row_result.h"
#include "kernels/cuda/row_io.cuh"
#include "kernels/cuda/row_kernel.h"

namespace klserve::cuda {

inline constexpr float kMaxTextEpsilon = 1e-8f;

template <typename TT>
struct RowTarget {
  const float* w = nullptr;  // per-head: the summed softmaxes (scratch)
  const TT* x = nullptr;     // aggregated: the weights as sent
  int shift = 0;             // aggregated: w = x * 2^shift
  double z = 0;
  bool zero = false;  // valid keys, but no mass on them (aggregated only)

  // w at slots [j0, j0 + kChunk): 0 on invalid slots and past the limit.
  __device__ void Weights(const RowSlots& slots, int64_t j0,
                          float (&v)[kChunk]) const {
    if (w != nullptr) {
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        v[c] = j0 + c < slots.limit ? w[j0 + c] : 0.0f;
      }
      return;
    }
    LoadRun(x, j0, slots.limit, v);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      v[c] = slots.Valid(j0 + c) ? (shift != 0 ? ldexpf(v[c], shift) : v[c])
                                 : 0.0f;
    }
  }

  // w at one valid slot j.
  __device__ float At(int64_t j) const {
    if (w != nullptr) return w[j];
    const float v = ToFloat(x[j]);
    return shift != 0 ? ldexpf(v, shift) : v;
  }
};

// exp(scale * (from - to)), the factor that moves a sum of exponentials
// shifted by `from` to the shift `to` >= from; an empty sum (from = -inf)
// stays 0.
__device__ inline double Rescale(float from, float to, float scale) {
  if (from == to) return 1.0;
  if (from == -kInf) return 0.0;
  return expf(scale * (from - to));
}

// One head's pass: its first NaN or +inf, its max over valid slots and
// sum(exp(scale * (x - max))) over valid slots, online.
struct HeadScan {
  double sum;
  float max;
  int32_t padding;
  int64_t first_bad;
};

// Builds w = sum_h P_h into the chunk's scratch, checking every head
// everywhere in the row first (NaN, +inf; a head with no finite valid logit).
// With no valid slot only the checks run. False, with `result`'s error set,
// when a check fails.
template <typename TT>
__device__ bool PerHeadTarget(const RowKernelParams& p, int64_t i,
                              const RowSlots& slots, RowTarget<TT>& target,
                              DeviceRowResult& result) {
  const float scale = p.softmax_scale;
  float* w = p.w + i * p.K;
  const auto combine = [scale](const HeadScan& a, const HeadScan& b) {
    HeadScan c;
    c.max = fmaxf(a.max, b.max);
    c.sum = a.sum * Rescale(a.max, c.max, scale) +
            b.sum * Rescale(b.max, c.max, scale);
    c.padding = 0;
    c.first_bad = a.first_bad < b.first_bad ? a.first_bad : b.first_bad;
    return c;
  };
  for (int64_t h = 0; h < p.H; ++h) {
    const TT* x = static_cast<const TT*>(p.target) + (h * p.n + i) * p.K;
    HeadScan scan{0.0, -kInf, 0, kNoSlot};
    ForEachRun(p.K, [&](int64_t j0) {
      float v[kChunk];
      LoadRun(x, j0, p.K, v);
      float run_max = -kInf;
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        const int64_t j = j0 + c;
        if (j < p.K && !(v[c] < kInf) && j < scan.first_bad) {
          scan.first_bad = j;
        }
        if (slots.Valid(j)) run_max = fmaxf(run_max, v[c]);
      }
      if (run_max > scan.max) {
        scan.sum *= Rescale(scan.max, run_max, scale);
        scan.max = run_max;
      }
      if (scan.max == -kInf) return;  // nothing finite yet
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        if (slots.Valid(j0 + c) && v[c] > -kInf) {
          scan.sum += expf(scale * (v[c] - scan.max));
        }
      }
    });
    scan = BlockReduce(scan, combine);
    if (scan.first_bad != kNoSlot) {
      result.error = static_cast<uint8_t>(RowError::kLogitsNotFinite);
      result.error_head = static_cast<int32_t>(h);
      result.error_slot = scan.first_bad;
      return false;
    }
    if (slots.count > 0 && scan.max == -kInf) {
      result.error = static_cast<uint8_t>(RowError::kLogitsAllMinusInf);
      result.error_head = static_cast<int32_t>(h);
      return false;
    }
    if (slots.count == 0) continue;  // fully masked: checks only
    // w += P_h = exp(scale * (x - max)) / sum; each thread updates the slots
    // it reads, so the heads fold in order slot by slot.
    const float a = static_cast<float>(1.0 / scan.sum);
    ForEachRun(slots.limit, [&](int64_t j0) {
      float v[kChunk];
      LoadRun(x, j0, slots.limit, v);
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        const int64_t j = j0 + c;
        if (j >= slots.limit) break;
        const float e = slots.Valid(j) ? expf(scale * (v[c] - scan.max)) : 0.0f;
        w[j] = h == 0 ? a * e : fmaf(a, e, w[j]);
      }
    });
  }
  target.w = w;
  target.z = static_cast<double>(p.H) +
             (p.maxtext ? static_cast<double>(kMaxTextEpsilon) : 0.0);
  return true;
}

struct WeightScan {
  double sum;
  int64_t first_bad;
};

// Checks the head-aggregated weights everywhere in the row (NaN, negative,
// +inf) and sums the valid ones into z. When z is far from 1, 1 / z would
// overflow or lose bits in float: w and z are then scaled alike by a power
// of two (the CPU backend's AggregatedTarget rule). False, with `result`'s
// error set, when a check fails.
template <typename TT>
__device__ bool AggregatedTarget(const RowKernelParams& p, int64_t i,
                                 const RowSlots& slots, RowTarget<TT>& target,
                                 DeviceRowResult& result) {
  const TT* x = static_cast<const TT*>(p.target) + i * p.K;
  WeightScan scan{0.0, kNoSlot};
  ForEachRun(p.K, [&](int64_t j0) {
    float v[kChunk];
    LoadRun(x, j0, p.K, v);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t j = j0 + c;
      if (j >= p.K) break;
      if ((!(v[c] >= 0.0f) || v[c] == kInf) && j < scan.first_bad) {
        scan.first_bad = j;
      }
      if (slots.Valid(j)) scan.sum += v[c];
    }
  });
  scan = BlockReduce(scan, [](const WeightScan& a, const WeightScan& b) {
    return WeightScan{a.sum + b.sum,
                      a.first_bad < b.first_bad ? a.first_bad : b.first_bad};
  });
  if (scan.first_bad != kNoSlot) {
    result.error = static_cast<uint8_t>(RowError::kWeightsBad);
    result.error_slot = scan.first_bad;
    return false;
  }
  target.x = x;
  target.zero = slots.count > 0 && scan.sum == 0;
  target.z =
      p.maxtext ? scan.sum + static_cast<double>(kMaxTextEpsilon) : scan.sum;
  if (target.z > 0 && (target.z < 0x1p-100 || target.z > 0x1p100)) {
    target.shift = -ilogb(target.z);
    target.z = ldexp(target.z, target.shift);
  }
  return true;
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_TARGET_CUH_
