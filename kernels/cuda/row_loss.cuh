#ifndef KLSERVE_KERNELS_CUDA_ROW_LOSS_CUH_
#define KLSERVE_KERNELS_CUDA_ROW_LOSS_CUH_

// The passes over one row's indexer scores I once its target is known: the
// device twin of the CPU backend's row_loss.cc and row_passes.h. Products are
// formed in float as the CPU forms them and summed in double.

#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/row_io.cuh"
#include "kernels/cuda/row_kernel.h"
#include "kernels/cuda/row_target.cuh"

namespace klserve::cuda {

__device__ inline int64_t MinSlot(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// The check of I everywhere in the row, its max over valid slots, and the
// target terms against I: sum(w), sum(w log w) split as ln2 * sum(w *
// exponent) + sum(w * mantissa_log), sum(w * I) (I = -inf counted as 0).
struct ScoreScan {
  double sum_w;
  double sum_w_exponent;
  double sum_w_mantissa_log;
  double sum_w_scores;
  float max;
  int32_t padding;
  int64_t first_bad;             // NaN or +inf
  int64_t first_minus_inf_mass;  // w > 0 and I = -inf
};

template <typename TS, typename TT>
__device__ ScoreScan ScanScores(const RowKernelParams& p, const TS* I,
                                const RowSlots& slots,
                                const RowTarget<TT>& target, bool with_terms) {
  ScoreScan s{0, 0, 0, 0, -kInf, 0, kNoSlot, kNoSlot};
  ForEachRun(p.K, [&](int64_t j0) {
    float iv[kChunk];
    LoadRun(I, j0, p.K, iv);
    float wv[kChunk] = {};
    if (with_terms) target.Weights(slots, j0, wv);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t j = j0 + c;
      if (j >= p.K) break;
      const float v = iv[c];
      if (!(v < kInf)) s.first_bad = MinSlot(s.first_bad, j);
      if (slots.Valid(j)) s.max = fmaxf(s.max, v);
      const float w = wv[c];
      if (w > 0.0f) {  // w = 0 adds nothing (and must not meet I = -inf)
        int exponent;
        float mantissa_log;
        LogSplit(w, exponent, mantissa_log);
        const double wd = w;
        s.sum_w += wd;
        s.sum_w_exponent += wd * exponent;
        s.sum_w_mantissa_log += wd * mantissa_log;
        if (v == -kInf) {
          s.first_minus_inf_mass = MinSlot(s.first_minus_inf_mass, j);
        } else {
          s.sum_w_scores += wd * v;
        }
      }
    }
  });
  return BlockReduce(s, [](const ScoreScan& a, const ScoreScan& b) {
    return ScoreScan{a.sum_w + b.sum_w,
                     a.sum_w_exponent + b.sum_w_exponent,
                     a.sum_w_mantissa_log + b.sum_w_mantissa_log,
                     a.sum_w_scores + b.sum_w_scores,
                     fmaxf(a.max, b.max),
                     0,
                     MinSlot(a.first_bad, b.first_bad),
                     MinSlot(a.first_minus_inf_mass, b.first_minus_inf_mass)};
  });
}

// q's normaliser L = sum(exp(I - m)) over valid slots and, for q's entropy,
// sum(e * (I - m)) over slots with e > 0.
struct ExpSums {
  double l;
  double e_d;
};

template <typename TS>
__device__ ExpSums ExpScores(const TS* I, const RowSlots& slots, float m,
                             bool with_entropy) {
  ExpSums s{0, 0};
  ForEachRun(slots.limit, [&](int64_t j0) {
    float iv[kChunk];
    LoadRun(I, j0, slots.limit, iv);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (!slots.Valid(j0 + c)) continue;
      const float d = iv[c] - m;
      const float e = expf(d);
      s.l += e;
      if (with_entropy && e > 0.0f) s.e_d += static_cast<double>(e) * d;
    }
  });
  return BlockReduce(s, [](const ExpSums& a, const ExpSums& b) {
    return ExpSums{a.l + b.l, a.e_d + b.e_d};
  });
}

// The row's q and p in float, as the CPU backend forms them.
struct RowDistributions {
  float m;      // max of I over valid slots
  float inv_l;  // 1 / L
  float inv_z;  // 1 / z

  __device__ float Q(const RowSlots& slots, int64_t j, float score) const {
    return (slots.Valid(j) ? expf(score - m) : 0.0f) * inv_l;
  }
};

// MAXTEXT's KL with its epsilon, and sum(q * g) with g = -p / (q + eps).
struct MaxTextSums {
  double kl;
  double sum_qg;
};

template <typename TS, typename TT>
__device__ MaxTextSums MaxTextTerms(const TS* I, const RowSlots& slots,
                                    const RowTarget<TT>& target,
                                    const RowDistributions& d) {
  MaxTextSums s{0, 0};
  ForEachRun(slots.limit, [&](int64_t j0) {
    float iv[kChunk], wv[kChunk];
    LoadRun(I, j0, slots.limit, iv);
    target.Weights(slots, j0, wv);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t j = j0 + c;
      if (j >= slots.limit) break;
      const float q = d.Q(slots, j, iv[c]);
      const float pj = wv[c] * d.inv_z;
      s.kl += pj * (logf(pj + kMaxTextEpsilon) - logf(q + kMaxTextEpsilon));
      s.sum_qg += q * (-pj / (q + kMaxTextEpsilon));
    }
  });
  return BlockReduce(s, [](const MaxTextSums& a, const MaxTextSums& b) {
    return MaxTextSums{a.kl + b.kl, a.sum_qg + b.sum_qg};
  });
}

// Writes row i's gradient: scale * dKL/dI on slots below the limit (EXACT:
// q - p; MAXTEXT: q * (g - sum_qg)), 0 past it. Null `d` writes zeros.
template <typename TS, typename TT>
__device__ void WriteGrad(const RowKernelParams& p, int64_t i, const TS* I,
                          const RowSlots& slots, const RowTarget<TT>& target,
                          const RowDistributions* d, float sum_qg) {
  void* row = static_cast<char*>(p.grad) + i * p.K * ElementSize(p.grad_dtype);
  const float scale = p.grad_scale;
  ForEachRun(p.K, [&](int64_t j0) {
    float g[kChunk] = {};
    if (d != nullptr && j0 < slots.limit) {
      float iv[kChunk], wv[kChunk];
      LoadRun(I, j0, slots.limit, iv);
      target.Weights(slots, j0, wv);
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        const int64_t j = j0 + c;
        if (j >= slots.limit) break;
        const float q = d->Q(slots, j, iv[c]);
        const float pj = wv[c] * d->inv_z;
        if (p.maxtext) {
          const float gs = -pj / (q + kMaxTextEpsilon);
          g[c] = scale * q * (gs - sum_qg);
        } else {
          g[c] = scale * (q - pj);
        }
      }
    }
    StoreRun(row, p.grad_dtype, j0, p.K, g);
  });
}

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_LOSS_CUH_
