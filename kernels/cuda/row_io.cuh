#ifndef KLSERVE_KERNELS_CUDA_ROW_IO_CUH_
#define KLSERVE_KERNELS_CUDA_ROW_IO_CUH_

// Reading and writing one row's slots on the device. Each thread handles
// runs of kChunk consecutive slots (thread i: slots [8i, 8i + 8), then
// [8i + 8 * kThreads, ...)), so that a warp reads whole cache lines and a
// thread can use one 16-byte load per run when the run is aligned. Inputs in
// BF16/FP16 are widened to float on load; the gradient is narrowed with
// round-to-nearest-even on store.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/dtype.h"

namespace klserve::cuda {

inline constexpr int kChunk = 8;
inline constexpr int64_t kNoSlot = INT64_MAX;  // "no bad slot found"
inline constexpr float kInf = __builtin_huge_valf();

// Calls f(j0) for the first slot j0 of each of this thread's runs below n.
template <typename F>
__device__ inline void ForEachRun(int64_t n, F&& f) {
  for (int64_t j0 = int64_t{threadIdx.x} * kChunk; j0 < n;
       j0 += int64_t{kThreads} * kChunk) {
    f(j0);
  }
}

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float ToFloat(__half v) { return __half2float(v); }

// Bytes per element of a float dtype (DTypeSize is host code).
__device__ inline int64_t ElementSize(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : 2;
}

__device__ inline bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Eight aligned elements (read-only data) as floats.
__device__ inline void LoadAligned(const float* p, float (&v)[kChunk]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ inline void LoadAligned(const __nv_bfloat16* p, float (&v)[kChunk]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}
__device__ inline void LoadAligned(const __half* p, float (&v)[kChunk]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* pairs = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(pairs[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}

// Slots [j0, j0 + kChunk) of a read-only row of n elements, as floats; slots
// at or past n read as 0.
template <typename T>
__device__ inline void LoadRun(const T* row, int64_t j0, int64_t n,
                               float (&v)[kChunk]) {
  const T* p = row + j0;
  if (j0 + kChunk <= n && Aligned16(p)) {
    LoadAligned(p, v);
    return;
  }
#pragma unroll
  for (int c = 0; c < kChunk; ++c) v[c] = j0 + c < n ? ToFloat(p[c]) : 0.0f;
}

// Writes slots [j0, min(j0 + kChunk, n)) of a gradient row of `dtype`.
__device__ inline void StoreRun(void* row, DType dtype, int64_t j0, int64_t n,
                                const float (&v)[kChunk]) {
  const bool whole = j0 + kChunk <= n;
  if (dtype == DType::kFloat32) {
    float* p = static_cast<float*>(row) + j0;
    if (whole && Aligned16(p)) {
      reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (j0 + c < n) p[c] = v[c];
    }
  } else if (dtype == DType::kBFloat16) {
    __nv_bfloat16* p = static_cast<__nv_bfloat16*>(row) + j0;
    if (whole && Aligned16(p)) {
      uint4 u;
      __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        pairs[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      }
      *reinterpret_cast<uint4*>(p) = u;
      return;
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (j0 + c < n) p[c] = __float2bfloat16_rn(v[c]);
    }
  } else {
    __half* p = static_cast<__half*>(row) + j0;
    if (whole && Aligned16(p)) {
      uint4 u;
      __half2* pairs = reinterpret_cast<__half2*>(&u);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        pairs[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      }
      *reinterpret_cast<uint4*>(p) = u;
      return;
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (j0 + c < n) p[c] = __float2half_rn(v[c]);
    }
  }
}

// Which slots of a row count: those below `limit` whose byte is nonzero, or
// all below `limit` when `bytes` is null (the CPU backend's RowValidity).
struct RowSlots {
  int64_t limit = 0;
  const uint8_t* bytes = nullptr;  // written by this kernel: plain loads
  int64_t count = 0;               // valid slots

  __device__ bool Valid(int64_t j) const {
    return j < limit && (bytes == nullptr || bytes[j] != 0);
  }
};

// log(w) of a finite w > 0 as exponent * ln2 + mantissa_log, with the
// mantissa in [sqrt(1/2), sqrt(2)) (the CPU backend's LogSplit): sums of
// w * exponent are exact in double, so sum(w log w) keeps its low bits when
// its terms are large.
__device__ inline void LogSplit(float w, int& exponent, float& mantissa_log) {
  int adjust = 0;
  if (w < 1.17549435e-38f) {  // subnormal: scale by 2^23 first
    w *= 8388608.0f;
    adjust = -23;
  }
  const uint32_t bits = __float_as_uint(w);
  int e = static_cast<int>((bits >> 23) & 0xff) - 126 + adjust;
  float m = __uint_as_float((bits & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  if (m < 0.70710678f) {
    m += m;
    e -= 1;
  }
  exponent = e;
  mantissa_log = logf(m);
}

// An unsigned key that orders scores as floats do (no NaN here); -0 and +0
// share a key, as they compare equal.
__device__ inline uint32_t OrderedKey(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_IO_CUH_
