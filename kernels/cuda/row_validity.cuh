#ifndef KLSERVE_KERNELS_CUDA_ROW_VALIDITY_CUH_
#define KLSERVE_KERNELS_CUDA_ROW_VALIDITY_CUH_

// Which slots of a row are valid, from every mask the problem carries: the
// device twin of the CPU backend's BuildRowValidity. The sparse stage's
// repeated keys were refused on the host before the launch; an index outside
// [0, S) names no key and makes its slot invalid here.

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/row_io.cuh"
#include "kernels/cuda/row_kernel.h"

namespace klserve::cuda {

// The per-key rules of row (b, t) other than causality.
struct KeyRules {
  const int32_t* segment_kv = nullptr;  // row b of segment_ids_kv
  int32_t segment_q = 0;
  const uint8_t* key_padding = nullptr;  // row b of key_padding_mask
  const uint8_t* mask = nullptr;         // the row's attention_mask

  __device__ bool Allows(int64_t s) const {
    if (segment_kv != nullptr) {
      const int32_t id = segment_kv[s];
      if (id < 0 || id != segment_q) return false;
    }
    if (key_padding != nullptr && key_padding[s] == 0) return false;
    if (mask != nullptr && mask[s] == 0) return false;
    return true;
  }
};

// Row i of the chunk (global row r): its slots, writing validity bytes to
// p.valid when the row has a mask or indices. Called by the whole block.
__device__ inline RowSlots BuildRowSlots(const RowKernelParams& p, int64_t i,
                                         int64_t r) {
  const int64_t b = r / p.T, t = r % p.T;
  const int64_t lb = b - p.batch_begin;  // batch within the uploaded ones
  // Keys at or past causal_end lie in the query's future.
  int64_t causal_end = p.S;
  if (p.causal) {
    causal_end = t + p.q_offset + 1;
    causal_end = causal_end < 0 ? 0 : (causal_end > p.S ? p.S : causal_end);
  }
  KeyRules rules;
  if (p.segment_ids_q != nullptr) {
    rules.segment_q = p.segment_ids_q[lb * p.T + t];
    rules.segment_kv = p.segment_ids_kv + lb * p.S;
  }
  if (p.key_padding != nullptr) rules.key_padding = p.key_padding + lb * p.S;
  if (p.mask != nullptr) rules.mask = p.mask + i * p.S;
  const bool has_rules = rules.segment_kv != nullptr ||
                         rules.key_padding != nullptr || rules.mask != nullptr;

  RowSlots slots;
  if (!p.sparse && !has_rules) {
    slots.limit = causal_end;
    slots.count = causal_end;
    return slots;
  }
  uint8_t* bytes = p.valid + i * p.K;
  int64_t count = 0;
  if (!p.sparse) {
    for (int64_t s = threadIdx.x; s < causal_end; s += kThreads) {
      const bool ok = rules.Allows(s);
      bytes[s] = ok;
      count += ok;
    }
    slots.limit = causal_end;
  } else {
    const int32_t* indices = p.indices + i * p.K;
    for (int64_t j = threadIdx.x; j < p.K; j += kThreads) {
      const int32_t key = indices[j];
      const bool ok =
          key >= 0 && key < causal_end && (!has_rules || rules.Allows(key));
      bytes[j] = ok;
      count += ok;
    }
    slots.limit = p.K;
  }
  slots.bytes = bytes;
  slots.count = BlockSum(count);  // also publishes the bytes to the block
  return slots;
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_VALIDITY_CUH_
