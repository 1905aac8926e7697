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

// Pulls the next data into cache, one line of each of up to three arrays per
// Step, while this row computes: memory transfer then overlaps arithmetic
// instead of following it (bench: dense_agg_fp32 ~1.4x; the sparse stage's
// indices as the third array, sparse_agg_fp32 1.09x with the AVX2 kernels
// on two cores).
class Prefetcher {
 public:
  Prefetcher() = default;
  Prefetcher(const void* a, const void* b, const void* c, int64_t bytes)
      : a_(static_cast<const char*>(a)),
        b_(static_cast<const char*>(b)),
        c_(static_cast<const char*>(c)),
        bytes_(bytes) {}
  void Step() {
    if (done_ < bytes_) {
      __builtin_prefetch(a_ + done_, 0, 3);
      if (b_ != nullptr) __builtin_prefetch(b_ + done_, 0, 3);
      if (c_ != nullptr) __builtin_prefetch(c_ + done_, 0, 3);
      done_ += 64;
    }
  }

 private:
  const char* a_ = nullptr;
  const char* b_ = nullptr;
  const char* c_ = nullptr;
  int64_t bytes_ = 0;
  int64_t done_ = 0;
};

struct ScanResult {
  bool any_bad = false;  // some slot in [0, n) breaks the value rule
  float max = -kInf;     // logits: max over valid slots
  double sum = 0;        // weights: sum over valid slots
};

// Running check of logits or scores: NaN or +inf anywhere, max over valid
// slots. Each takes one register, whatever the variant (which lane saw what
// matters to neither): with two registers each, the AVX2 variant ran the
// per-head loop, which carried one beside its exponentials, 1.31x slower
// (the loop alone, its rows in L1, one core). That loop now carries less
// (ScanNextHead).
struct LogitsCheck {
  RegI bad{};  // lanes that saw a NaN or +inf
  RegF max = SplatRegister(-kInf);

  void Add(VecF v, VecI in) {
    bad |= OrOfParts(NotBelow(v, Splat(kInf)));
    max = MaxRegister(max, MaxOfParts(Select(in, v, Splat(-kInf))));
  }
  // Values this service computed (the projections form's logits): a NaN or
  // +inf counts only on the lanes `in`, since a masked key's product takes
  // no part in the loss, whichever mask hides it.
  void AddComputed(VecF v, VecI in) {
    bad |= OrOfParts(NotBelow(v, Splat(kInf)) & in);
    max = MaxRegister(max, MaxOfParts(Select(in, v, Splat(-kInf))));
  }
  ScanResult Result() const { return {Any(bad), ReduceMax(max), 0}; }
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

// ScanLogits of the n computed values x (LogitsCheck::AddComputed): every
// slot below n is valid when `valid` is null, else where its byte is nonzero.
inline ScanResult ScanComputedLogits(const float* x, int64_t n,
                                     const uint8_t* valid) {
  LogitsCheck check;
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t count = LanesAt(i, n);
    const VecF v = LoadAt(x, i, count, 0.0f);
    check.AddComputed(
        v, valid != nullptr ? ValidLanes<true>(valid, i, n) : LanesBelow(i, n));
  }
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
  // A scan that met a subnormal weight is run again with the log that
  // takes them.
  static constexpr bool kRescanSubnormal = !kSubnormalWeights;
  // Four-lane sums: eight-lane ones took eight of the AVX2 variant's 16
  // registers, and it spilled them on every vector.
  QuadD sw{}, swe{}, swm{}, swi{};

  // w zero on invalid slots; finite_i the scores with -inf read as 0, so
  // that no 0 * -inf meets the sums (a w = 0 lane's log parts are finite,
  // and its products 0). Lanes j and j + 8 are summed first, each pair of
  // exact products in one rounding (AddExactProduct), then folded to four.
  void Add(VecF w, VecF finite_i) {
    const LogParts parts = kSubnormalWeights ? LogSplit(w) : LogSplitNormal(w);
    // The four float vectors go through memory to their conversion to
    // double (WidenFrom): the empty asm tells the compiler that the stores
    // are read there, so that it cannot take the values back from the
    // registers with a shuffle per half (bench, AVX2 on one core:
    // dense_agg_fp32 1.15x).
    alignas(64) float lanes[4][kLanes];
    Store(lanes[0], w);
    Store(lanes[1], parts.exponent);
    Store(lanes[2], parts.mantissa_log);
    Store(lanes[3], finite_i);
    asm("" : "+m"(lanes));
    const VecD w_lo = WidenFrom<0>(lanes[0]);
    const VecD w_hi = WidenFrom<kLanes / 2>(lanes[0]);
    const auto dot = [&](const float* x) {
      return FoldToQuad(AddExactProduct(w_lo * WidenFrom<0>(x), w_hi,
                                        WidenFrom<kLanes / 2>(x)));
    };
    sw += FoldToQuad(w_lo + w_hi);
    swe += dot(lanes[1]);
    swm += dot(lanes[2]);
    swi += dot(lanes[3]);
  }
  TargetTerms Result() const {
    return {ReduceSum(sw), ReduceSum(swe), ReduceSum(swm), ReduceSum(swi)};
  }
};

// sum(w) alone, in the lane order of TargetTermsSums and so with its bits:
// all that a MAXTEXT row without diagnostics needs of the terms (its KL
// takes its own logs, MaxTextTermsRow), which spares the scan a log and
// three products per slot (bench, two cores: dense_agg_fp32_maxtext 1.24x
// with AVX2, 1.28x with AVX-512).
struct TargetWeightSum {
  static constexpr bool kRescanSubnormal = false;  // no log to take them
  QuadD sw{};

  void Add(VecF w, VecF) { sw += FoldToQuad(WideSum(w)); }
  TargetTerms Result() const { return {.sum_w = ReduceSum(sw)}; }
};

// -1 where w is neither 0 nor a normal, positive, finite float: NaN,
// negative, +inf or subnormal. Read off the bits: w + 0x7f800000 wraps the
// normal positive floats, [0x00800000, 0x7f7fffff], onto the lowest signed
// ints, [INT_MIN, -0x01000001], and every other pattern above them.
inline VecI UnusualWeight(VecF w) {
  // The add in unsigned arithmetic, which wraps (a signed overflow is
  // undefined); the compare signed.
  const VecI shifted =
      std::bit_cast<VecI>(std::bit_cast<VecU>(w) + 0x7f800000u);
  return (shifted > -0x01000001) & ~(w == Splat(0.0f));
}

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

// Terms: the sums to take of the target, TargetTermsSums<false> or
// TargetWeightSum (TargetTermsSums<true> in the rescan it makes).
template <bool kMasked, bool kRawWeights, typename Terms>
RowScan ScanRow(const float* w, const float* I, int64_t n, int64_t limit,
                const uint8_t* valid, float* masked_copy, Prefetcher& next) {
  // The running max and the rare lanes (a NaN or +inf score, an unusual
  // weight, mass on -inf) each take one register, whatever the variant:
  // which lane saw what does not matter, and the AVX2 variant's 16
  // registers must also hold the four double sums.
  RegF max = SplatRegister(-kInf);
  RegI rare{};
  Terms terms;
  // In a local: a reference's fields would be stored back on every vector.
  Prefetcher prefetch = next;
  for (int64_t i = 0; i < n; i += kLanes) {
    prefetch.Step();
    const int64_t count = LanesAt(i, n);
    const VecF iv = LoadAt(I, i, count, 0.0f);
    VecI found = NotBelow(iv, Splat(kInf));  // NaN or +inf
    VecF raw;
    if constexpr (kRawWeights) {
      raw = LoadAt(w, i, count, 0.0f);
      found |= UnusualWeight(raw);
    }
    if (i >= limit) {
      rare |= OrOfParts(found);
      continue;
    }
    VecF wv;
    if (!kMasked && i + kLanes <= limit) {  // every lane valid
      max = MaxRegister(max, MaxOfParts(iv));
      wv = kRawWeights ? raw : Load(w + i);
    } else {
      const VecI in = ValidLanes<kMasked>(valid, i, limit);
      max = MaxRegister(max, MaxOfParts(Select(in, iv, Splat(-kInf))));
      // Without kRawWeights, w is defined below the limit only; the lanes
      // past it read as 0.
      wv = kRawWeights ? Select(in, raw, Splat(0.0f))
                       : LoadAt(w, i, LanesAt(i, limit), 0.0f);
    }
    if (kRawWeights && masked_copy != nullptr) {
      StoreAt(masked_copy, i, LanesAt(i, limit), wv);
    }
    // Target mass on a -inf score; and a built target's weights (>= 0 by
    // construction) may be subnormal, where raw ones were classified above,
    // wherever they sit.
    const VecI minus_inf = iv == Splat(-kInf);
    if constexpr (kRawWeights) {
      found |= minus_inf & ~(wv == Splat(0.0f));
    } else {
      found |= (minus_inf & ~(wv == Splat(0.0f))) | UnusualWeight(wv);
    }
    rare |= OrOfParts(found);
    terms.Add(wv, Select(minus_inf, Splat(0.0f), iv));
  }
  next = prefetch;
  RowScan scan;
  scan.scores.max = ReduceMax(max);
  scan.terms = terms.Result();
  scan.target.sum = scan.terms.sum_w;
  if (!Any(rare)) return scan;
  const bool subnormal =
      FindRareValues<kMasked, kRawWeights>(w, I, n, limit, valid, scan);
  if constexpr (Terms::kRescanSubnormal) {
    if (subnormal && !scan.target.any_bad && !scan.scores.any_bad) {
      // Again with the log that takes subnormals: the same bits on every
      // other lane.
      Prefetcher none;
      return ScanRow<kMasked, kRawWeights, TargetTermsSums<true>>(
          w, I, n, limit, valid, masked_copy, none);
    }
  }
  return scan;
}

// e[s] = 2^kHeadroom exp(mul * (x[s] - shift)) (Exp) on valid slots and 0 on
// invalid ones, for s < limit, with mul > 0 and x[s] <= shift on valid
// slots; returns sum(e).
// `extra(i, count, d, e)` runs on each vector (d the exponent, e its exp,
// count < kLanes only for the last), so that callers can fold more work
// into the pass. The hottest loop of the per-head path: whole vectors skip
// the limit mask, and sums run in float lanes for blocks of kBlock vectors
// before each block is added in double (bench: dense_perhead_fp32 ~1.3x).
// Its exponents are never above 0, so Exp needs no cap, and with mul = 1
// (the indexer's softmax, and logits sent scaled) no product either
// (together, AVX2 on one core: dense_perhead_fp32 1.14x).
enum class ExpScaling {
  kNone,        // x - shift, for mul = 1
  kDifference,  // mul * (x - shift)
  // mul * x - mul * shift, for mul below kTinyExpScale. Logits spanning more
  // than float's range (3e38 and -3e38) make x - shift overflow to -inf,
  // which a scale of at least 2^-121 would have taken below -128, where Exp
  // gives 0 anyway; a smaller scale brings them back to a few units
  // (1e-38: +-3), which a softmax tells apart. Its products never overflow,
  // the maximum's is exactly 0, and rounding is monotonic, so no exponent
  // is above 0.
  kDifferenceOfScaled,
};
inline constexpr float kTinyExpScale = 0x1p-121f;

template <bool kMasked, int kHeadroom, ExpScaling kScaling, typename Extra>
double ExpRowOf(const float* x, int64_t limit, const uint8_t* valid,
                float shift, float mul, float* e, Extra& caller_extra) {
  constexpr int64_t kBlock = 8;
  // The extra's state in a local of this function, copied back at the end:
  // the stores to e (and an extra's own) could otherwise alias it, and the
  // loop would load and store it on every vector.
  Extra extra = caller_extra;
  // mul * (x - shift), not mul * x - mul * shift: exactly 0 at the maximum
  // and never above it, whatever the magnitudes (with logits near -1e30 the
  // rounding of mul * shift alone would overflow exp), but for the tiny
  // scales of kDifferenceOfScaled. With kNone mul is 1, and the product,
  // which would change no bit, is left out.
  const float mul_shift = mul * shift;
  // On a vector or one register of it (RegF).
  const auto exponent = [&](auto xv) {
    if constexpr (kScaling == ExpScaling::kNone) {
      return xv - shift;
    } else if constexpr (kScaling == ExpScaling::kDifference) {
      return mul * (xv - shift);
    } else {
      return mul * xv - mul_shift;
    }
  };
  VecD sum{};
  int64_t i = 0;
  // One whole vector at i, its exponentials added to `block`, register by
  // register: each one's exp is stored and summed before the next one's
  // starts, so that the AVX2 variant holds one register's temporaries at a
  // time rather than two, and its 16 registers keep more of the exp's
  // constants (docs/PERFORMANCE.md, "The per-head loop's registers").
  const auto whole = [&](int64_t i, VecF& block) {
    VecF d, ev;
    // Loaded before the stores to e, which the compiler must assume the
    // bytes may alias.
    const VecI in = kMasked ? LoadValid(valid + i) : VecI{};
    ForEachPart([&](size_t p) {
      const int64_t at = i + p * VecF::kPartLanes;
      d.part[p] = exponent(LoadRegister(x + at));
      if constexpr (kMasked) {
        d.part[p] = Select(in.part[p], d.part[p], SplatRegister(-kInf));
      }
      ev.part[p] = Exp<kHeadroom>(d.part[p]);
      StoreRegister(e + at, ev.part[p]);
      block.part[p] += ev.part[p];
    });
    extra(i, kLanes, d, ev);
  };
  // Whole blocks as a loop of fixed length, with no test per vector for the
  // block's end.
  for (; i + kBlock * kLanes <= limit; i += kBlock * kLanes) {
    VecF block{};
    for (int64_t k = 0; k < kBlock; ++k) whole(i + k * kLanes, block);
    sum += WideSum(block);
  }
  VecF block{};
  for (; i + kLanes <= limit; i += kLanes) whole(i, block);
  if (i < limit) {
    const int64_t count = limit - i;
    const VecF d = Select(ValidLanes<kMasked>(valid, i, limit),
                          exponent(LoadPart(x + i, count, 0.0f)), Splat(-kInf));
    const VecF ev = Exp<kHeadroom>(d);
    StorePart(e + i, ev, count);
    extra(i, count, d, ev);
    block += ev;
  }
  sum += WideSum(block);
  caller_extra = extra;
  return ReduceSum(sum);
}

template <bool kMasked, int kHeadroom = 0, typename Extra>
double ExpRow(const float* x, int64_t limit, const uint8_t* valid, float shift,
              float mul, float* e, Extra& extra) {
  if (mul == 1.0f) {
    return ExpRowOf<kMasked, kHeadroom, ExpScaling::kNone>(
        x, limit, valid, shift, mul, e, extra);
  }
  if (mul < kTinyExpScale) {
    return ExpRowOf<kMasked, kHeadroom, ExpScaling::kDifferenceOfScaled>(
        x, limit, valid, shift, mul, e, extra);
  }
  return ExpRowOf<kMasked, kHeadroom, ExpScaling::kDifference>(
      x, limit, valid, shift, mul, e, extra);
}

// The main attention's softmax numerators, which build the target p, are
// taken as 2^kSoftmaxHeadroom exp(...) (ExpRow<kMasked, kSoftmaxHeadroom>)
// and their sums carry the factor too, so that 1 / sum takes it back out:
// P = e / sum is the same float wherever exp(...) is a normal float, and
// where it is below FLT_MIN (a logit about 87 to 103 below its head's
// maximum, with a scale of 1) P keeps the subnormal value that float
// arithmetic gives, rather than 0. Such a P counts where it meets a score
// of -inf (the EXACT KL's error) or a score far below the others.
inline constexpr int kSoftmaxHeadroom = 23;

// v (a sum of such numerators, or a factor meant for them) without the
// factor: exact, a power of two.
inline double WithoutSoftmaxHeadroom(double v) {
  return std::ldexp(v, -kSoftmaxHeadroom);
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

// The EXACT KL's cross term sum(w * (I - m)) is taken from the scan's sums,
// as sum(w * I) - m * sum(w), while the scores' maximum m is at most this
// in magnitude. Past it those two parts cancel: their error, about
// 2^-53 * |m| * sum(w) per rounding, outgrows the float32 noise of the
// other terms (at |m| = 1e20 a key of weight 4e-18 against the largest
// weight's 1 lost its KL term of 424.8 whole), and the sum is taken after m
// instead (ShiftedScoreSum). Below it, the cross term of a row of 2^17 keys
// errs typically by about 2^-53 * 1024 * sqrt(2^17), 4e-11 nats, and at
// worst by about 2e-8 (n in place of sqrt(n)), where the KL's float32 terms
// err by 1e-8. Taking the shifted sum in every row instead made
// dense_agg_fp32 about 1.2x slower (AVX-512, two runs each).
inline constexpr float kShiftedCrossTermAbove = 1024.0f;

// sum(w * (I - m)) with the scores' maximum m: every product has the same
// sign, so nothing cancels. w is zero on invalid slots, and a score of -inf
// is read as 0 there (mass on -inf is refused first). I - m is taken in
// double, and its product rounds by itself (not fused: the same bits in
// every variant).
struct ShiftedScoreSum {
  const float* w;
  const float* I;
  double m;
  QuadD sum{};

  void operator()(int64_t i, int64_t count, VecF, VecF) {
    const VecF iv = LoadAt(I, i, count, 0.0f);
    alignas(64) float lanes[2][kLanes];
    Store(lanes[0], LoadAt(w, i, count, 0.0f));
    Store(lanes[1], Select(iv == Splat(-kInf), Splat(0.0f), iv));
    asm("" : "+m"(lanes));  // as in TargetTermsSums::Add
    sum += FoldToQuad(WidenFrom<0>(lanes[0]) * (WidenFrom<0>(lanes[1]) - m) +
                      WidenFrom<kLanes / 2>(lanes[0]) *
                          (WidenFrom<kLanes / 2>(lanes[1]) - m));
  }
  double Result() const { return ReduceSum(sum); }
};

// Checks the next head's logits while this head's exponentials compute: the
// next head streams in from memory under the arithmetic, and the head after
// it is prefetched (`ahead`; head rows lie T * K elements apart, and the
// hardware prefetcher stops at page boundaries). Whole vectors only;
// `scanned` is where it stopped, and Result checks the rest exactly.
//
// The whole vectors take the max alone, one instruction per register, and
// leave their NaN and +inf (which the exact check finds with two more) to
// the next head's own exponentials, where any of them makes the sum NaN:
// a NaN logit gives a NaN exponent, a +inf one an exponent of +inf, whose
// exp is NaN (a max of +inf is checked exactly first). The caller checks
// that sum (HeadSumIsBad). Masked slots' NaNs do not reach the
// exponentials, so with a mask each lane also sums the logits it sees:
// NaN or +inf from a NaN or +inf on, whatever follows; a sum of large
// finite logits can overflow to +inf too, so such a head is checked again
// exactly.
template <bool kMasked>
struct ScanNextHead {
  static constexpr int64_t kL1Distance = 16 * kLanes;

  ScanNextHead(const float* x, const float* ahead, const uint8_t* valid)
      : x(x), ahead(ahead), valid(valid) {}

  const float* x;
  const float* ahead;
  const uint8_t* valid;
  RegF max = SplatRegister(-kInf);
  RegF sum{};  // with kMasked only
  int64_t scanned = 0;

  void operator()(int64_t i, int64_t count, VecF, VecF) {
    if (count < kLanes) return;
    static_assert(sizeof(VecF) <= 64, "one prefetch per vector covers it");
    // Into L1 a few vectors ahead for this loop's own loads; into L2 for the
    // head after next.
    __builtin_prefetch(x + i + kL1Distance, 0, 3);
    __builtin_prefetch(ahead + i, 0, 2);
    const VecF v = Load(x + i);
    if constexpr (kMasked) {
      for (int p = 0; p < kParts; ++p) sum += v.part[p];
      max = MaxRegister(
          max, MaxOfParts(Select(LoadValid(valid + i), v, Splat(-kInf))));
    } else {
      max = MaxRegister(max, MaxOfParts(v));
    }
    scanned = i + count;
  }

  // The check of x[0, n), lanes below `limit` counting for the max; a NaN
  // or +inf in the whole vectors may instead show in HeadSumIsBad. A max
  // of -inf or +inf, or NaN, is taken again exactly: a NaN there may have
  // hidden others, and the reports of a row of -inf and of a bad value
  // must tell the two apart.
  ScanResult Result(int64_t n, int64_t limit) const {
    LogitsCheck check;
    check.max = max;
    ScanLogitsRange<kMasked>(x, scanned, n, limit, valid, check);
    const ScanResult result = check.Result();
    const bool sum_flagged = kMasked && Any(~(sum < SplatRegister(kInf)));
    if (sum_flagged || !(result.max > -kInf && result.max < kInf)) {
      return ScanLogits<kMasked>(x, n, limit, valid);
    }
    return result;
  }
};

// Whether a head's sum of exponentials says its logits hold a NaN or +inf
// (ScanNextHead).
inline bool HeadSumIsBad(double sum) { return std::isnan(sum); }

// w += a * e_prev: the previous head's softmax folded into this head's loop
// rather than a pass of its own.
struct AccumulatePreviousHead {
  float* w;
  const float* e_prev;
  float a;

  void operator()(int64_t i, int64_t count, VecF, VecF) {
    StoreAt(w, i, count,
            Fma(Splat(a), LoadAt(e_prev, i, count, 0.0f),
                LoadAt(w, i, count, 0.0f)));
  }
};

// w = 0, in the first head's loop, where no previous head is to add.
struct ZeroRow {
  float* w;

  void operator()(int64_t i, int64_t count, VecF, VecF) {
    StoreAt(w, i, count, VecF{});
  }
};

template <typename A, typename B>
struct BothExtras {
  A a;
  B b;
  void operator()(int64_t i, int64_t count, VecF d, VecF e) {
    a(i, count, d, e);
    b(i, count, d, e);
  }
};

// w += a * e, for s < limit.
inline void AccumulateHead(float* w, const float* e, float a, int64_t limit) {
  AccumulatePreviousHead accumulate{w, e, a};
  for (int64_t i = 0; i < limit; i += kLanes) {
    accumulate(i, LanesAt(i, limit), VecF{}, VecF{});
  }
}

// The two steps of the blocked head sum (kHeadsPerFloatSum).
// sums = w (the first block) or sums + w, then w = 0, for s < count.
inline void FoldHeadBlock(float* w, double* sums, int64_t count, bool first) {
  for (int64_t s = 0; s < count; ++s) {
    sums[s] = first ? double{w[s]} : sums[s] + w[s];
    w[s] = 0.0f;
  }
}

// w = the float nearest sums + w, the heads' whole sum, for s < count.
inline void FinishHeadSums(float* w, const double* sums, int64_t count) {
  for (int64_t s = 0; s < count; ++s) {
    w[s] = static_cast<float>(sums[s] + w[s]);
  }
}

// g[s] = value(s, count) for the vectors of slots s < limit. With `stream`
// (g is the response's buffer, which nothing reads again) whole
// vector-aligned blocks of g go past the cache with streaming stores, so
// that the destination lines need not be fetched first, and the unaligned
// head and the tail with ordinary ones; with ordinary stores throughout,
// the MAXTEXT gradient spent a quarter of its time fetching the lines it
// was about to overwrite (streaming: dense_agg_fp32_maxtext 1.16x). Without it
// (a buffer the caller reads next: a 16-bit conversion, the projections form's
// tile) every store is ordinary.
template <typename Value>
void StreamRow(float* g, int64_t limit, bool stream, Value&& value) {
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(g) % sizeof(VecF);
  int64_t i = 0;
  if (stream && misalign % sizeof(float) == 0) {
    const int64_t head = std::min<int64_t>(
        limit, misalign == 0 ? 0 : (sizeof(VecF) - misalign) / sizeof(float));
    if (head > 0) StorePart(g, value(0, head), head);
    for (i = head; i + kLanes <= limit; i += kLanes) {
      StoreStream(g + i, value(i, kLanes));
    }
  }
  for (; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    StoreAt(g, i, count, value(i, count));
  }
}

// EXACT gradient on slots s < limit: scale * (e / L - w / Z), the
// difference in one FMA, streamed as StreamRow says. The scale comes last:
// scale / Z alone can overflow where scale * (w / Z) does not.
inline void ExactGradRow(const float* e, const float* w, float inv_l,
                         float inv_z, float scale, int64_t limit, float* g,
                         bool stream) {
  const VecF vl = Splat(inv_l), vz = Splat(inv_z), vs = Splat(scale);
  StreamRow(g, limit, stream, [&](int64_t i, int64_t count) {
    return vs * Fma(LoadAt(e, i, count, 0.0f), vl,
                    -(LoadAt(w, i, count, 0.0f) * vz));
  });
}

// log(x) in float, for a normal x > 0.
inline VecF LogOfNormal(VecF x) {
  const LogParts parts = LogSplitNormal(x);
  return parts.exponent * Splat(0.693359375f) +
         (parts.mantissa_log + parts.exponent * Splat(-2.12194440e-4f));
}

struct MaxTextTerms {
  double kl = 0;
  double sum_qg = 0;
};

// MaxText's KL with its epsilon, and sum(q * g) with g = -p / (q + eps),
// where p = w / Z and q = e / L; g goes to `g_out`, for the gradient pass.
// Per slot one division and one log: with r = 1 / (q + eps), g = -p r and
// log(p + eps) - log(q + eps) = log((p + eps) r), in place of two logs
// (bench, AVX2 on one core: dense_agg_fp32_maxtext 1.07-1.19x).
// The log's argument lies in [eps / (1 + eps), (1 + eps) / eps], so it takes
// the normal-only split.
inline MaxTextTerms MaxTextTermsRow(const float* e, const float* w, float inv_l,
                                    float inv_z, int64_t limit, float* g_out) {
  VecD kl{}, qg{};
  const VecF eps = Splat(kMaxTextEpsilon);
  const VecF vl = Splat(inv_l), vz = Splat(inv_z);
  for (int64_t i = 0; i < limit; i += kLanes) {
    const int64_t count = LanesAt(i, limit);
    const VecF q = LoadAt(e, i, count, 0.0f) * vl;
    const VecF p = LoadAt(w, i, count, 0.0f) * vz;
    const VecF r = Splat(1.0f) / (q + eps);
    kl += WideSum(p * LogOfNormal((p + eps) * r));
    const VecF g = -p * r;
    StoreAt(g_out, i, count, g);
    qg += WideSum(q * g);
  }
  return {ReduceSum(kl), ReduceSum(qg)};
}

// MAXTEXT gradient on slots s < limit: scale * q * (g - sum_qg), with g as
// MaxTextTermsRow left it, streamed as StreamRow says.
inline void MaxTextGradRow(const float* e, const float* g, float inv_l,
                           float sum_qg, float scale, int64_t limit,
                           float* grad, bool stream) {
  const VecF vl = Splat(inv_l), vqg = Splat(sum_qg), vs = Splat(scale);
  StreamRow(grad, limit, stream, [&](int64_t i, int64_t count) {
    const VecF q = LoadAt(e, i, count, 0.0f) * vl;
    return vs * q * (LoadAt(g, i, count, 0.0f) - vqg);
  });
}

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ROW_PASSES_H_
