#ifndef KLSERVE_KERNELS_CPU_VARIANT_ROW_PASSES_H_
#define KLSERVE_KERNELS_CPU_VARIANT_ROW_PASSES_H_

// The vector passes over one row that the CPU backend composes. A row has n
// slots; slots at or past `limit` are invalid (the causal cut), and when
// `valid` is given (kMasked) a slot below the limit counts only if its byte
// is nonzero. Sums are accumulated in double.

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/cpu/variant/vec_math.h"
#include "kernels/row_rules.h"
#include "kernels/value_errors.h"

namespace klserve::cpu::KLSERVE_ISA {

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
      __builtin_prefetch(a_ + done_, 0, 3);
      if (b_ != nullptr) __builtin_prefetch(b_ + done_, 0, 3);
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

// Running check of logits or scores: NaN or +inf anywhere, max over valid
// slots.
struct LogitsCheck {
  VecI good = SplatI(-1);  // v < +inf fails for NaN and +inf alike
  VecF max = Splat(-kInf);

  void Add(VecF v, VecI in) {
    good &= v < Splat(kInf);
    const VecF valid_v = Select(in, v, Splat(-kInf));
    max = Max(max, valid_v);
  }
  // Every lane valid.
  void Add(VecF v) {
    good &= v < Splat(kInf);
    max = Max(max, v);
  }
  ScanResult Result() const { return {Any(~good), ReduceMax(max), 0}; }
};

// Checks x[begin, n) into `check`; lanes below `limit` count for the max.
template <bool kMasked>
void ScanLogitsRange(const float* x, int64_t begin, int64_t n, int64_t limit,
                     const uint8_t* valid, LogitsCheck& check) {
  for (int64_t i = begin; i < n; i += kLanes) {
    const VecF v = LoadAt(x, i, LanesAt(i, n), 0.0f);
    check.Add(v, i < limit ? ValidLanes<kMasked>(valid, i, limit) : VecI{});
  }
}

template <bool kMasked>
ScanResult ScanLogits(const float* x, int64_t n, int64_t limit,
                      const uint8_t* valid) {
  LogitsCheck check;
  ScanLogitsRange<kMasked>(x, 0, n, limit, valid, check);
  return check.Result();
}

// Sums of the target weights w (zero on invalid slots) against the scores I:
// sum(w), sum(w log w) split as ln2 * sum(w * exponent) + sum(w *
// mantissa_log), and sum(w * I), all with exact products in double.
struct TargetTerms {
  double sum_w = 0;
  double sum_w_exponent = 0;
  double sum_w_mantissa_log = 0;
  double sum_w_scores = 0;
  bool mass_on_minus_inf = false;  // some valid w > 0 has I = -inf
};

// kSubnormalWeights: whether w may hold subnormals; the log is cheaper
// without them.
template <bool kSubnormalWeights>
struct TargetTermsSums {
  VecD sw{}, swe{}, swm{}, swi{};

  // Returns the lanes where w > 0 meets I = -inf, and, without
  // kSubnormalWeights, those where w is subnormal (its parts are then wrong).
  VecI Add(VecF w, VecF I) {
    const VecI minus_inf = I == Splat(-kInf);
    // w = 0 lanes: the log parts are finite, so w * part is 0; I may be -inf
    // there and must not meet 0 * -inf.
    const LogParts parts = kSubnormalWeights ? LogSplit(w) : LogSplitNormal(w);
    const VecF finite_i = Select(minus_inf, Splat(0.0f), I);
    const VecD w_lo = WidenLow(w), w_hi = WidenHigh(w);
    sw += w_lo + w_hi;
    swe += w_lo * WidenLow(parts.exponent) + w_hi * WidenHigh(parts.exponent);
    swm += w_lo * WidenLow(parts.mantissa_log) +
           w_hi * WidenHigh(parts.mantissa_log);
    swi += w_lo * WidenLow(finite_i) + w_hi * WidenHigh(finite_i);
    const VecI positive = w > Splat(0.0f);
    if constexpr (kSubnormalWeights) return positive & minus_inf;
    return positive & (minus_inf | (w < Splat(kFloatMin)));
  }
  TargetTerms Result() const {
    return {ReduceSum(sw), ReduceSum(swe), ReduceSum(swm), ReduceSum(swi)};
  }
};

// The one streaming pass over a row's scores I, together with its target:
// checks I and takes its max over valid slots, and sums the target terms.
// With kRawWeights the target is the head-aggregated row as sent: it is also
// checked (NaN, negative, +inf anywhere), summed over valid slots, and, when
// `masked_copy` is given, written there with invalid slots zeroed; w is then
// that zeroed row. Otherwise w is already zero on invalid slots.
struct RowScan {
  ScanResult target;  // kRawWeights only
  ScanResult scores;
  TargetTerms terms;
};

// The rare findings of a row (a bad value, target mass on a -inf score, a
// subnormal weight), exactly, by a scalar pass: ScanRow gathers them in one
// mask only, which keeps its loop within the AVX2 variant's 16 registers.
// Returns whether a valid weight is subnormal.
template <bool kMasked, bool kRawWeights>
bool FindRareValues(const float* w, const float* I, int64_t n, int64_t limit,
                    const uint8_t* valid, RowScan& scan) {
  if constexpr (kRawWeights) {
    scan.target.any_bad = FirstBadValue(w, n, /*weights=*/true) >= 0;
  }
  scan.scores.any_bad = FirstBadValue(I, n, /*weights=*/false) >= 0;
  bool subnormal = false;
  for (int64_t s = 0; s < limit; ++s) {
    if (kMasked && valid[s] == 0) continue;
    scan.terms.mass_on_minus_inf |= w[s] > 0 && I[s] == -kInf;
    subnormal |= w[s] > 0 && w[s] < kFloatMin;
  }
  return subnormal;
}

template <bool kMasked, bool kRawWeights, bool kSubnormalWeights = false>
RowScan ScanRow(const float* w, const float* I, int64_t n, int64_t limit,
                const uint8_t* valid, float* masked_copy, Prefetcher& next) {
  VecF max = Splat(-kInf);
  // Lanes that saw a NaN or +inf score, a bad weight, mass on -inf, or a
  // subnormal weight.
  VecI rare{};
  TargetTermsSums<kSubnormalWeights> terms;
  for (int64_t i = 0; i < n; i += kLanes) {
    next.Step();
    const int64_t count = LanesAt(i, n);
    const VecF iv = LoadAt(I, i, count, 0.0f);
    rare |= ~(iv < Splat(kInf));  // fails for NaN and +inf alike
    VecF raw;
    if constexpr (kRawWeights) {
      raw = LoadAt(w, i, count, 0.0f);
      rare |= ~(raw >= Splat(0.0f)) | (raw == Splat(kInf));
    }
    if (i >= limit) continue;
    VecF wv;
    if (!kMasked && i + kLanes <= limit) {  // every lane valid
      max = Max(max, iv);
      wv = kRawWeights ? raw : Load(w + i);
    } else {
      const VecI in = ValidLanes<kMasked>(valid, i, limit);
      max = Max(max, Select(in, iv, Splat(-kInf)));
      // Without kRawWeights, w is defined below the limit only; the lanes
      // past it read as 0.
      wv = kRawWeights ? Select(in, raw, Splat(0.0f))
                       : LoadAt(w, i, LanesAt(i, limit), 0.0f);
    }
    if (kRawWeights && masked_copy != nullptr) {
      StoreAt(masked_copy, i, LanesAt(i, limit), wv);
    }
    rare |= terms.Add(wv, iv);
  }
  RowScan scan;
  scan.scores.max = ReduceMax(max);
  scan.terms = terms.Result();
  scan.target.sum = scan.terms.sum_w;
  if (!Any(rare)) return scan;
  const bool subnormal =
      FindRareValues<kMasked, kRawWeights>(w, I, n, limit, valid, scan);
  if constexpr (!kSubnormalWeights) {
    if (subnormal && !scan.target.any_bad && !scan.scores.any_bad) {
      // Again with the log that takes subnormals: the same bits on every
      // other lane.
      Prefetcher none;
      return ScanRow<kMasked, kRawWeights, true>(w, I, n, limit, valid,
                                                 masked_copy, none);
    }
  }
  return scan;
}

// e[s] = exp(mul * (x[s] - shift)) on valid slots and 0 on invalid ones, for
// s < limit; returns sum(e). `extra(i, count, d, e)` runs on each vector (d
// the exponent, e its exp, count < kLanes only for the last), so that callers
// can fold more work into the loop. The hottest loop of the per-head path:
// whole vectors skip the limit mask, and sums run in float lanes for blocks
// of kBlock vectors before each block is added in double (bench:
// dense_perhead_fp32 ~1.3x).
template <bool kMasked, typename Extra>
double ExpRow(const float* x, int64_t limit, const uint8_t* valid, float shift,
              float mul, float* e, Extra&& extra) {
  constexpr int64_t kBlock = 8;
  // mul * (x - shift), not mul * x - mul * shift: exactly 0 at the maximum
  // and never above it, whatever the magnitudes (with logits near -1e30 the
  // rounding of mul * shift alone would overflow exp).
  const VecF vmul = Splat(mul);
  const VecF vshift = Splat(shift);
  VecD sum{};
  VecF block{};
  int64_t i = 0;
  for (int64_t n = 0; i + kLanes <= limit; i += kLanes, ++n) {
    VecF d = vmul * (Load(x + i) - vshift);
    if constexpr (kMasked) d = Select(LoadValid(valid + i), d, Splat(-kInf));
    const VecF ev = Exp(d);
    Store(e + i, ev);
    extra(i, kLanes, d, ev);
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
               vmul * (LoadPart(x + i, count, 0.0f) - vshift), Splat(-kInf));
    const VecF ev = Exp(d);
    StorePart(e + i, ev, count);
    extra(i, count, d, ev);
    block += ev;
  }
  sum += WideSum(block);
  return ReduceSum(sum);
}

// ExpRow extras.
struct NoExtra {
  void operator()(int64_t, int64_t, VecF, VecF) {}
};

// sum(e * d) over slots with e > 0: the entropy of q is log L - that / L.
struct EntropySum {
  VecD sum{};
  void operator()(int64_t, int64_t, VecF d, VecF e) {
    sum += WideDot(e, Select(e > Splat(0.0f), d, Splat(0.0f)));
  }
};

// Checks the next head's logits while this head's exponentials compute: the
// next head streams in from memory under the arithmetic, and the head after
// it is prefetched (`ahead`; head rows lie T * K elements apart, and the
// hardware prefetcher stops at page boundaries). Whole vectors only;
// `scanned` is where it stopped.
template <bool kMasked>
struct ScanNextHead {
  static constexpr int64_t kL1Distance = 16 * kLanes;

  ScanNextHead(const float* x, const float* ahead, const uint8_t* valid)
      : x(x), ahead(ahead), valid(valid) {}

  const float* x;
  const float* ahead;
  const uint8_t* valid;
  LogitsCheck check;
  int64_t scanned = 0;

  void operator()(int64_t i, int64_t count, VecF, VecF) {
    if (count < kLanes) return;
    static_assert(sizeof(VecF) <= 64, "one prefetch per vector covers it");
    // Into L1 a few vectors ahead for this loop's own loads; into L2 for the
    // head after next.
    __builtin_prefetch(x + i + kL1Distance, 0, 3);
    __builtin_prefetch(ahead + i, 0, 2);
    if constexpr (kMasked) {
      check.Add(Load(x + i), LoadValid(valid + i));
    } else {
      check.Add(Load(x + i));
    }
    scanned = i + count;
  }
};

// w = a * e_prev (first) or w += a * e_prev: the previous head's softmax
// folded into this head's loop rather than a pass of its own.
struct AccumulatePreviousHead {
  float* w;
  const float* e_prev;
  float a;
  bool first;

  void operator()(int64_t i, int64_t count, VecF, VecF) {
    const VecF x = LoadAt(e_prev, i, count, 0.0f);
    StoreAt(w, i, count,
            first ? Splat(a) * x : Fma(Splat(a), x, LoadAt(w, i, count, 0.0f)));
  }
};

template <typename A, typename B>
struct BothExtras {
  A& a;
  B& b;
  void operator()(int64_t i, int64_t count, VecF d, VecF e) {
    a(i, count, d, e);
    b(i, count, d, e);
  }
};

// w = a * e (first head) or w += a * e, for s < limit.
inline void AccumulateHead(float* w, const float* e, float a, int64_t limit,
                           bool first) {
  AccumulatePreviousHead accumulate{w, e, a, first};
  for (int64_t i = 0; i < limit; i += kLanes) {
    accumulate(i, LanesAt(i, limit), VecF{}, VecF{});
  }
}

// EXACT gradient on slots s < limit: scale * (e / L - w / Z). Whole
// vector-aligned blocks of g are written with streaming stores (the row is
// not read again, and the destination lines need not be fetched first);
// the unaligned head and the tail with ordinary ones.
inline void ExactGradRow(const float* e, const float* w, float inv_l,
                         float inv_z, float scale, int64_t limit, float* g) {
  const VecF vl = Splat(inv_l), vz = Splat(inv_z), vs = Splat(scale);
  const auto grad_at = [&](int64_t i, int64_t count) {
    return vs *
           (LoadAt(e, i, count, 0.0f) * vl - LoadAt(w, i, count, 0.0f) * vz);
  };
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(g) % sizeof(VecF);
  int64_t i = 0;
  if (misalign % sizeof(float) == 0) {
    const int64_t head = std::min<int64_t>(
        limit, misalign == 0 ? 0 : (sizeof(VecF) - misalign) / sizeof(float));
    if (head > 0) StorePart(g, grad_at(0, head), head);
    for (i = head; i + kLanes <= limit; i += kLanes) {
      StoreStream(g + i, grad_at(i, kLanes));
    }
  }
  for (; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    StoreAt(g, i, count, grad_at(i, count));
  }
}

// MaxText's KL with its epsilon, and sum(q * g) with g = -p / (q + eps),
// where p = w / Z and q = e / L; g goes to `g_out`, for the gradient pass.
// The logs' arguments are at least eps, so they take the normal-only split.
struct MaxTextTerms {
  double kl = 0;
  double sum_qg = 0;
};

inline VecF LogAtLeastEps(VecF x) {
  const LogParts parts = LogSplitNormal(x);
  return parts.exponent * Splat(0.693359375f) +
         (parts.mantissa_log + parts.exponent * Splat(-2.12194440e-4f));
}

inline MaxTextTerms MaxTextTermsRow(const float* e, const float* w, float inv_l,
                                    float inv_z, int64_t limit, float* g_out) {
  VecD kl{}, qg{};
  const VecF eps = Splat(kMaxTextEpsilon);
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    const VecF q = LoadAt(e, i, count, 0.0f) * Splat(inv_l);
    const VecF p = LoadAt(w, i, count, 0.0f) * Splat(inv_z);
    kl += WideSum(p * (LogAtLeastEps(p + eps) - LogAtLeastEps(q + eps)));
    const VecF g = -p / (q + eps);
    StoreAt(g_out, i, count, g);
    qg += WideSum(q * g);
  }
  return {ReduceSum(kl), ReduceSum(qg)};
}

// MAXTEXT gradient on slots s < limit: scale * q * (g - sum_qg), with g as
// MaxTextTermsRow left it.
inline void MaxTextGradRow(const float* e, const float* g, float inv_l,
                           float sum_qg, float scale, int64_t limit,
                           float* grad) {
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    const VecF q = LoadAt(e, i, count, 0.0f) * Splat(inv_l);
    StoreAt(grad, i, count,
            Splat(scale) * q * (LoadAt(g, i, count, 0.0f) - Splat(sum_qg)));
  }
}

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ROW_PASSES_H_
