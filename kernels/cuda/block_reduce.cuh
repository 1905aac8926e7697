#ifndef KLSERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_
#define KLSERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_

// Deterministic block reductions: a fixed butterfly within each warp, then
// every thread folds the warps' results in warp order. The same inputs give
// the same bits on every run, whatever the scheduling (no atomics).

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace klserve::cuda {

inline constexpr int kThreads = 256;  // threads per block: one row each
inline constexpr int kWarps = kThreads / 32;

// v from lane (lane ^ mask), for any trivially copyable T of whole words.
template <typename T>
__device__ inline T ShuffleXor(const T& v, int mask) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % 4 == 0);
  constexpr int kWords = sizeof(T) / 4;
  int words[kWords];
  memcpy(words, &v, sizeof(T));
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    words[k] = __shfl_xor_sync(0xffffffffu, words[k], mask);
  }
  T out;
  memcpy(&out, words, sizeof(T));
  return out;
}

// Shared memory for one partial result per warp, one array per type.
template <typename T>
__device__ inline T* WarpPartials() {
  __shared__ alignas(16) unsigned char storage[kWarps * sizeof(T)];
  return reinterpret_cast<T*>(storage);
}

// op over the values of all kThreads threads of the block, returned to every
// thread. Every thread must call it (it synchronises the block), which also
// makes the block's earlier global and shared memory writes visible to all
// its threads. `op` must be associative enough for the caller's purpose; the
// order of application is fixed.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op) {
  T* partials = WarpPartials<T>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) {
    // The lower lane's value first: both lanes of a pair get the same bits.
    const T other = ShuffleXor(v, mask);
    v = (lane & mask) ? op(other, v) : op(v, other);
  }
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  T total = partials[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) total = op(total, partials[w]);
  __syncthreads();  // the next call may overwrite `partials`
  return total;
}

__device__ inline int64_t BlockSum(int64_t v) {
  return BlockReduce(v, [](int64_t a, int64_t b) { return a + b; });
}

__device__ inline double BlockSum(double v) {
  return BlockReduce(v, [](double a, double b) { return a + b; });
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_
