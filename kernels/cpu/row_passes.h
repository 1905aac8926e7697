#ifndef KLSERVE_KERNELS_CPU_ROW_PASSES_H_
#define KLSERVE_KERNELS_CPU_ROW_PASSES_H_

// The vector passes over one row that the CPU backend composes. A row has n
// slots; slots at or past `limit` are invalid (the causal cut), and when
// `valid` is given (kMasked) a slot below the limit counts only if its byte
// is nonzero. Sums are accumulated in double.

#include <cstdint>

#include "kernels/cpu/vec_math.h"

namespace klserve::cpu {

inline int64_t LanesAt(int64_t i, int64_t n) {
  return n - i < kLanes ? n - i : kLanes;
}

inline VecF LoadAt(const float* x, int64_t i, int64_t count, float fill) {
  return count == kLanes ? Load(x + i) : LoadPart(x + i, count, fill);
}

inline void StoreAt(float* x, int64_t i, int64_t count, VecF v) {
  if (count == kLanes) {
    Store(x + i, v);
  } else {
    StorePart(x + i, v, count);
  }
}

// Lanes of the vector at i that are valid slots.
template <bool kMasked>
inline VecI ValidLanes(const uint8_t* valid, int64_t i, int64_t limit) {
  if constexpr (kMasked) {
    const int64_t count = LanesAt(i, limit);
    return count == kLanes ? LoadValid(valid + i)
                           : LoadValidPart(valid + i, count);
  } else {
    return LanesBelow(i, limit);
  }
}

// Pulls the next data into cache, one line of each of one or two arrays per
// Step, while this row computes: memory transfer then overlaps arithmetic
// instead of following it (bench: dense_agg_fp32 ~1.4x).
class Prefetcher {
 public:
  Prefetcher() = default;
  Prefetcher(const void* a, const void* b, int64_t bytes)
      : a_(static_cast<const char*>(a)),
        b_(static_cast<const char*>(b)),
        bytes_(bytes) {}
  void Step() {
    if (done_ < bytes_) {
      __builtin_prefetch(a_ + done_, 0, 2);
      if (b_ != nullptr) __builtin_prefetch(b_ + done_, 0, 2);
      done_ += 64;
    }
  }

 private:
  const char* a_ = nullptr;
  const char* b_ = nullptr;
  int64_t bytes_ = 0;
  int64_t done_ = 0;
};

struct ScanResult {
  bool any_bad = false;  // some slot in [0, n) breaks the value rule
  float max = -kInf;     // logits: max over valid slots
  double sum = 0;        // weights: sum over valid slots
};

// Logits or scores: flags NaN and +inf anywhere in [0, n) and takes the max
// over valid slots.
template <bool kMasked>
ScanResult ScanLogits(const float* x, int64_t n, int64_t limit,
                      const uint8_t* valid, Prefetcher& next) {
  VecI bad{};
  VecF vmax = Splat(-kInf);
  for (int64_t i = 0; i < n; i += kLanes) {
    next.Step();
    const int64_t count = LanesAt(i, n);
    const VecF v = LoadAt(x, i, count, 0.0f);
    bad |= (v != v) | (v == Splat(kInf));
    if (!kMasked && i + kLanes <= limit) {
      vmax = vmax > v ? vmax : v;
    } else if (i < limit) {
      const VecF in =
          Select(ValidLanes<kMasked>(valid, i, limit), v, Splat(-kInf));
      vmax = vmax > in ? vmax : in;
    }
  }
  return {Any(bad), ReduceMax(vmax), 0};
}

// Head-aggregated target weights: flags NaN, negative and +inf anywhere in
// [0, n), sums the valid slots and, when `masked_copy` is given, writes the
// row with invalid slots zeroed to it (slots [0, limit)).
template <bool kMasked>
ScanResult ScanWeights(const float* x, int64_t n, int64_t limit,
                       const uint8_t* valid, float* masked_copy,
                       Prefetcher& next) {
  VecI bad{};
  VecD sum{};
  for (int64_t i = 0; i < n; i += kLanes) {
    next.Step();
    const VecF v = LoadAt(x, i, LanesAt(i, n), 0.0f);
    bad |= ~(v >= Splat(0.0f)) | (v == Splat(kInf));
    if (i < limit) {
      const VecF in =
          Select(ValidLanes<kMasked>(valid, i, limit), v, Splat(0.0f));
      sum += WideSum(in);
      if (masked_copy != nullptr) {
        StoreAt(masked_copy, i, LanesAt(i, limit), in);
      }
    }
  }
  return {Any(bad), 0, ReduceSum(sum)};
}

// e[s] = exp(mul * (x[s] - shift)) on valid slots and 0 on invalid ones, for
// s < limit. Returns sum(e). The hottest loop of the per-head path: full
// vectors skip the limit mask, and sums run in float lanes for blocks of
// kBlock vectors before each block is added in double (bench:
// dense_perhead_fp32 ~1.3x).
template <bool kMasked>
double ExpRow(const float* x, int64_t limit, const uint8_t* valid, float shift,
              float mul, float* e, Prefetcher& next) {
  constexpr int64_t kBlock = 8;
  // mul * x - mul * shift: a rounding of mul * shift shifts every slot of
  // the row alike, which the normalisation cancels.
  const VecF vmul = Splat(mul);
  const VecF vbias = Splat(-mul * shift);
  VecD sum{};
  VecF block{};
  int64_t i = 0;
  for (int64_t n = 0; i + kLanes <= limit; i += kLanes, ++n) {
    next.Step();
    VecF d = vmul * Load(x + i) + vbias;
    if constexpr (kMasked) d = Select(LoadValid(valid + i), d, Splat(-kInf));
    const VecF ev = Exp(d);
    Store(e + i, ev);
    block += ev;
    if (n % kBlock == kBlock - 1) {
      sum += WideSum(block);
      block = VecF{};
    }
  }
  if (i < limit) {
    const int64_t count = limit - i;
    const VecF d =
        Select(ValidLanes<kMasked>(valid, i, limit),
               vmul * LoadPart(x + i, count, 0.0f) + vbias, Splat(-kInf));
    const VecF ev = Exp(d);
    StorePart(e + i, ev, count);
    block += ev;
  }
  sum += WideSum(block);
  return ReduceSum(sum);
}

// w = a * e (first head) or w += a * e, for s < limit.
inline void AccumulateHead(float* w, const float* e, float a, int64_t limit,
                           bool first) {
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    VecF v = Splat(a) * LoadAt(e, i, count, 0.0f);
    if (!first) v += LoadAt(w, i, count, 0.0f);
    StoreAt(w, i, count, v);
  }
}

// One pass over the scores I of a row once the target weights w (zero on
// invalid slots) are known, for s < limit: stores e = exp(I - m) (0 on
// invalid slots) and sums L = sum(e), sum(e (I - m)) (kEntropy), sum(w), sum(w
// log w) split as ln2 * sum(w * exponent) + sum(w * mantissa_log), and sum(w *
// I), with exact products. Fusing them keeps the row's loads to one pass.
struct ScoreTerms {
  double sum_e = 0;
  double sum_e_shifted = 0;
  double sum_w = 0;
  double sum_w_exponent = 0;
  double sum_w_mantissa_log = 0;
  double sum_w_scores = 0;
  bool mass_on_minus_inf = false;  // some w > 0 has I = -inf
};

template <bool kMasked, bool kEntropy>
ScoreTerms ScoreTermsRow(const float* w, const float* I, int64_t limit,
                         const uint8_t* valid, float m, float* e,
                         Prefetcher& next) {
  VecD se{}, sed{}, sw{}, swe{}, swm{}, swi{};
  VecI inf_mass{};
  for (int64_t i = 0; i < limit; i += kLanes) {
    next.Step();
    const int64_t count = LanesAt(i, limit);
    const VecF wv = LoadAt(w, i, count, 0.0f);
    const VecF iv = LoadAt(I, i, count, 0.0f);
    const VecI minus_inf = iv == Splat(-kInf);
    inf_mass |= (wv > Splat(0.0f)) & minus_inf;
    const VecF d = Select(ValidLanes<kMasked>(valid, i, limit), iv - Splat(m),
                          Splat(-kInf));
    const VecF ev = Exp(d);
    StoreAt(e, i, count, ev);
    // w = 0 lanes: the log parts are finite, so w * part is 0; I may be -inf
    // there and must not meet 0 * -inf.
    const LogParts parts = LogSplit(wv);
    const VecF iv_finite = Select(minus_inf, Splat(0.0f), iv);
    const VecD w_lo = WidenLow(wv), w_hi = WidenHigh(wv);
    se += WideSum(ev);
    if constexpr (kEntropy) {
      sed += WideDot(ev, Select(ev > Splat(0.0f), d, Splat(0.0f)));
    }
    sw += w_lo + w_hi;
    swe += w_lo * WidenLow(parts.exponent) + w_hi * WidenHigh(parts.exponent);
    swm += w_lo * WidenLow(parts.mantissa_log) +
           w_hi * WidenHigh(parts.mantissa_log);
    swi += w_lo * WidenLow(iv_finite) + w_hi * WidenHigh(iv_finite);
  }
  return {ReduceSum(se),  ReduceSum(sed), ReduceSum(sw), ReduceSum(swe),
          ReduceSum(swm), ReduceSum(swi), Any(inf_mass)};
}

// EXACT gradient on slots s < limit: scale * (e / L - w / Z).
// Streams the stores when g is vector-aligned.
inline void ExactGradRow(const float* e, const float* w, float inv_l,
                         float inv_z, float scale, int64_t limit, float* g) {
  const bool stream = reinterpret_cast<uintptr_t>(g) % sizeof(VecF) == 0;
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    const VecF q = LoadAt(e, i, count, 0.0f) * Splat(inv_l);
    const VecF p = LoadAt(w, i, count, 0.0f) * Splat(inv_z);
    const VecF gv = Splat(scale) * (q - p);
    if (stream && count == kLanes) {
      StoreStream(g + i, gv);
    } else {
      StoreAt(g, i, count, gv);
    }
  }
}

inline constexpr float kMaxTextEpsilon = 1e-8f;

// MaxText's KL with its epsilon, and sum(q * g) with g = -p / (q + eps),
// where p = w / Z and q = e / L.
struct MaxTextTerms {
  double kl = 0;
  double sum_qg = 0;
};

inline MaxTextTerms MaxTextTermsRow(const float* e, const float* w, float inv_l,
                                    float inv_z, int64_t limit) {
  VecD kl{}, qg{};
  const VecF eps = Splat(kMaxTextEpsilon);
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    const VecF q = LoadAt(e, i, count, 0.0f) * Splat(inv_l);
    const VecF p = LoadAt(w, i, count, 0.0f) * Splat(inv_z);
    kl += WideSum(p * (Log(p + eps) - Log(q + eps)));
    qg += WideSum(q * (-p / (q + eps)));
  }
  return {ReduceSum(kl), ReduceSum(qg)};
}

// MAXTEXT gradient on slots s < limit: scale * q * (g - sum_qg).
inline void MaxTextGradRow(const float* e, const float* w, float inv_l,
                           float inv_z, float sum_qg, float scale,
                           int64_t limit, float* g) {
  const VecF eps = Splat(kMaxTextEpsilon);
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    const VecF q = LoadAt(e, i, count, 0.0f) * Splat(inv_l);
    const VecF p = LoadAt(w, i, count, 0.0f) * Splat(inv_z);
    const VecF gs = -p / (q + eps);
    StoreAt(g, i, count, Splat(scale) * q * (gs - Splat(sum_qg)));
  }
}

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ROW_PASSES_H_
