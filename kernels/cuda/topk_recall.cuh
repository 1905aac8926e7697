#ifndef KLSERVE_KERNELS_CUDA_TOPK_RECALL_CUH_
#define KLSERVE_KERNELS_CUDA_TOPK_RECALL_CUH_

// Top-k recall of one row on the device: the target mass on the k valid
// slots with the highest scores, ties going to the lower slot (the CPU
// backend's TopkRecall takes the lower key, which differs in the sparse
// stage: docs/cuda.md). Rather than sorting, the k-th highest score is
// found by bisection over the 32 bits of an order-preserving key, then the
// ties it shares by bisection over the slot index; each step is one counting
// pass over the row. About 32 + log2(limit) passes: a diagnostic, not a hot
// path.

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/row_io.cuh"
#include "kernels/cuda/row_target.cuh"

namespace klserve::cuda {

// Number of valid slots j with keep(key of I[j], j), over the block.
template <typename TS, typename Keep>
__device__ int64_t CountSlots(const TS* I, const RowSlots& slots, Keep keep) {
  int64_t count = 0;
  for (int64_t j = threadIdx.x; j < slots.limit; j += kThreads) {
    if (slots.Valid(j) && keep(OrderedKey(ToFloat(I[j])), j)) ++count;
  }
  return BlockSum(count);
}

// Needs slots.count >= 1, k >= 1, and no NaN in I.
template <typename TS, typename TT>
__device__ double TopkRecall(const TS* I, const RowSlots& slots,
                             const RowTarget<TT>& target, int64_t recall_k) {
  const int64_t k = recall_k < slots.count ? recall_k : slots.count;
  // The largest key `kth` with at least k valid keys >= kth: the k-th
  // highest key.
  uint32_t kth = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = kth | (1u << bit);
    const int64_t at_least = CountSlots(
        I, slots, [=](uint32_t key, int64_t) { return key >= candidate; });
    if (at_least >= k) kth = candidate;
  }
  // Fewer than k keys lie above kth; `need` of its ties complete the k.
  const int64_t above =
      CountSlots(I, slots, [=](uint32_t key, int64_t) { return key > kth; });
  const int64_t need = k - above;
  // The smallest end such that the ties in slots [0, end) number `need`:
  // ties below lo < need <= ties below hi.
  int64_t lo = 0, hi = slots.limit;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t ties = CountSlots(I, slots, [=](uint32_t key, int64_t j) {
      return key == kth && j < mid;
    });
    if (ties >= need) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  double mass = 0;
  for (int64_t j = threadIdx.x; j < slots.limit; j += kThreads) {
    if (!slots.Valid(j)) continue;
    const uint32_t key = OrderedKey(ToFloat(I[j]));
    if (key > kth || (key == kth && j < hi)) mass += target.At(j);
  }
  return BlockSum(mass) / target.z;
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_TOPK_RECALL_CUH_
