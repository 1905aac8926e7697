#ifndef KLSERVE_KERNELS_CPU_VARIANT_VEC_MATH_H_
#define KLSERVE_KERNELS_CPU_VARIANT_VEC_MATH_H_

// SIMD primitives for the CPU backend, on 64-byte vectors of 16 floats
// (kernels/cpu/variant/wide.h). exp and log are our own polynomial
// approximations (about 1 ulp on the ranges used here); libm's scalar expf is
// ~15x slower on these machines, and libmvec would tie results to the glibc
// version.
//
// Every variant computes on the same vectors in the same order, so all give
// the same bits. The few operations that name an instruction (Fma,
// AddExactProduct, MaxRegister, NotBelow, StoreStream, LoadValid, the
// widenings, FoldToQuad) are written per ISA; each gives the same bits as the
// others.
//
// Loads and stores take unaligned pointers. A row's last, partial vector goes
// through LoadPart/StorePart so that every element uses the same formula.

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/cpu/variant/wide.h"

namespace klserve::cpu::KLSERVE_ISA {

using VecF = Wide<RegF>;
using VecI = Wide<RegI>;  // also the lane masks of VecF compares
using VecU = Wide<RegU>;
using VecD = Wide<RegD>;  // 8 doubles
using VecL = Wide<RegL>;

inline constexpr int kLanes = VecF::kSize;
static_assert(kLanes == 16 && VecD::kSize == kLanes / 2);

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// v in every lane: a broadcast. Not RegF{} + v, which GCC computes as an
// addition (0 + -0 is +0, so it may not fold it) on every use.
template <typename R, typename Lane, size_t... L>
inline R Broadcast(Lane v, std::index_sequence<L...>) {
  return R{(static_cast<void>(L), v)...};
}
inline RegF SplatRegister(float v) {
  return Broadcast<RegF>(v, std::make_index_sequence<VecF::kPartLanes>{});
}
inline VecF Splat(float v) {
  return EachPart([&](size_t) { return SplatRegister(v); });
}

typedef float RegFu __attribute__((vector_size(kRegisterBytes), aligned(4)));

inline RegF LoadRegister(const float* p) {
  return *reinterpret_cast<const RegFu*>(p);
}
inline void StoreRegister(float* p, RegF v) {
  *reinterpret_cast<RegFu*>(p) = v;
}
inline VecF Load(const float* p) {
  return EachPart(
      [&](size_t i) { return LoadRegister(p + i * VecF::kPartLanes); });
}
inline void Store(float* p, VecF v) {
  ForEachPart(
      [&](size_t i) { StoreRegister(p + i * VecF::kPartLanes, v.part[i]); });
}

// A store that bypasses the cache, for output the row will not read again
// (no read-for-ownership of the destination line). `p` must be aligned to
// sizeof(VecF); FinishStreamingStores orders them before later stores.
inline void StoreStream(float* p, VecF v) {
  ForEachPart([&](size_t i) {
    float* at = p + i * VecF::kPartLanes;
#if defined(__AVX512F__)
    _mm512_stream_ps(at, v.part[i]);
#elif defined(__AVX__)
    _mm256_stream_ps(at, v.part[i]);
#else
    _mm_stream_ps(at, v.part[i]);
#endif
  });
}
inline void FinishStreamingStores() { _mm_sfence(); }

// Lanes [count, kLanes) read as `fill`.
inline VecF LoadPart(const float* p, int64_t count, float fill) {
  VecF v = Splat(fill);
  std::memcpy(&v, p, count * sizeof(float));
  return v;
}
inline void StorePart(float* p, VecF v, int64_t count) {
  std::memcpy(p, &v, count * sizeof(float));
}

// Validity bytes (nonzero = valid) as lane masks: -1 valid, 0 not. Each
// register's bytes widen in one load-and-extend instruction; GCC 12 built
// the generic __builtin_convertvector from one scalar byte load per lane.
// The AVX-512 form is the zero-masked one with every lane set, for the
// reason MaxRegister gives.
inline VecI LoadValid(const uint8_t* p) {
  return EachPart([&](size_t i) -> RegI {
    const uint8_t* at = p + i * VecI::kPartLanes;
#if defined(__AVX512F__)
    const __m512i lanes = _mm512_maskz_cvtepu8_epi32(
        0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
#elif defined(__AVX2__)
    const __m256i lanes = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
#else
    int32_t four;
    std::memcpy(&four, at, sizeof four);
    const __m128i lanes = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
#endif
    return std::bit_cast<RegI>(lanes) != 0;
  });
}
inline VecI LoadValidPart(const uint8_t* p, int64_t count) {
  uint8_t bytes[kLanes] = {};
  std::memcpy(bytes, p, count);
  return LoadValid(bytes);
}

// -1 in lanes whose index i + lane is below `limit`.
inline VecI LanesBelow(int64_t i, int64_t limit) {
  VecI iota;
  for (int l = 0; l < kLanes; ++l) iota.Set(l, l);
  const int64_t room = limit - i;
  const int32_t r = room > kLanes ? kLanes : (room < 0 ? 0 : int32_t(room));
  return iota < r;
}

// a > b ? a : b, lane by lane: b where either is NaN, as maxps defines it,
// so one instruction in every variant (GCC emitted a compare and a blend
// for the Select). The AVX-512 form is the masked one with every lane set:
// GCC 12 warns that the unmasked one reads an uninitialised vector.
inline RegF MaxRegister(RegF a, RegF b) {
#if defined(__AVX512F__)
  return _mm512_mask_max_ps(a, 0xffff, a, b);
#elif defined(__AVX__)
  return _mm256_max_ps(a, b);
#else
  return _mm_max_ps(a, b);
#endif
}

// The max of v's parts, lane by lane, in one register: a running max that
// takes one register whatever the variant, where the lanes' order does not
// matter (the maximum of a set is the same whichever way it is taken, but
// for the sign of a zero, which ReduceMax settles).
inline RegF MaxOfParts(VecF v) {
  RegF m = v.part[0];
  for (int p = 1; p < kParts; ++p) m = MaxRegister(m, v.part[p]);
  return m;
}
// The OR of a mask's parts, for a running "any lane" in one register.
inline RegI OrOfParts(VecI v) {
  RegI m = v.part[0];
  for (int p = 1; p < kParts; ++p) m |= v.part[p];
  return m;
}

// -1 where !(a < b): a >= b, or either is NaN. One compare (the unordered
// "not less than" predicate), where ~(a < b) took two.
inline VecI NotBelow(VecF a, VecF b) {
  return EachPart([&](size_t p) -> RegI {
#if defined(__AVX512F__)
    return std::bit_cast<RegI>(_mm512_movm_epi32(
        _mm512_cmp_ps_mask(a.part[p], b.part[p], _CMP_NLT_UQ)));
#elif defined(__AVX__)
    return std::bit_cast<RegI>(
        _mm256_cmp_ps(a.part[p], b.part[p], _CMP_NLT_UQ));
#else
    return std::bit_cast<RegI>(_mm_cmpnlt_ps(a.part[p], b.part[p]));
#endif
  });
}

// Lanes [offset, offset + 8) of v in double. Each double register takes one
// half of a float register; the intrinsics name the one instruction per half
// (GCC's generic shuffle and conversion went through memory).
template <int kOffset>
inline VecD Widen(VecF v) {
  return EachPart([&](auto j) -> RegD {
    constexpr int kFirst = kOffset + decltype(j)::value * VecD::kPartLanes;
    const RegF& r = v.part[kFirst / VecF::kPartLanes];
    constexpr bool kHigh = kFirst % VecF::kPartLanes != 0;
#if defined(__AVX512DQ__)
    return _mm512_maskz_cvtps_pd(0xff, _mm512_extractf32x8_ps(r, kHigh));
#elif defined(__AVX__)
    return _mm256_cvtps_pd(kHigh ? _mm256_extractf128_ps(r, 1)
                                 : _mm256_castps256_ps128(r));
#else
    return _mm_cvtps_pd(kHigh ? _mm_movehl_ps(r, r) : r);
#endif
  });
}
inline VecD WidenLow(VecF v) { return Widen<0>(v); }
inline VecD WidenHigh(VecF v) { return Widen<kLanes / 2>(v); }

// p[offset, offset + 8) in double, converted as it is loaded: no shuffle to
// take a register's upper half, which in the AVX2 variant is one more
// instruction per half and, on Intel, shares its port with the conversion.
// p aligned to 32 bytes.
template <int kOffset>
inline VecD WidenFrom(const float* p) {
  return EachPart([&](auto j) -> RegD {
    const float* at = p + kOffset + decltype(j)::value * VecD::kPartLanes;
#if defined(__AVX512F__)
    return _mm512_maskz_cvtps_pd(0xff, _mm256_load_ps(at));
#elif defined(__AVX__)
    return _mm256_cvtps_pd(_mm_load_ps(at));
#else
    return _mm_cvtps_pd(_mm_castsi128_ps(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
#endif
  });
}

// acc + a * b, where the product is exact in double (a and b widened from
// floats: at most 48 significant bits): one FMA where the variant has one,
// a multiply and an add in the baseline. With the product exact, both
// round once, at the sum, and give the same bits.
inline VecD AddExactProduct(VecD acc, VecD a, VecD b) {
  return EachPart([&](size_t p) -> RegD {
#if defined(__AVX512F__)
    return _mm512_fmadd_pd(a.part[p], b.part[p], acc.part[p]);
#elif defined(__FMA__)
    return _mm256_fmadd_pd(a.part[p], b.part[p], acc.part[p]);
#else
    return a.part[p] * b.part[p] + acc.part[p];
#endif
  });
}

#if !defined(__FMA__)
// Whether the double `s` lies exactly halfway between two adjacent floats.
// Among normal floats, the halfway bit is 24 places below s's leading bit;
// below 2^-126, float's step is 2^-149 whatever s's size, so the halfway
// bit is 2^-150.
inline bool OnFloatMidpoint(double s) {
  const uint64_t bits = std::bit_cast<uint64_t>(s);
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  // The halfway bit's place in the significand (52 is the leading bit).
  const int half = std::max(28, -98 - exponent);
  if (half > 52) return false;  // below 2^-150 (or zero): no midpoint
  const uint64_t significand =
      (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
  return (significand & ((uint64_t{2} << half) - 1)) == uint64_t{1} << half;
}

// The baseline has no FMA instruction, so it rounds a * b + c once the way
// vfmadd does, from doubles: a float product is exact in double, so
// s = a * b + c in double is the exact value rounded once, and rounding s to
// float gives the correctly rounded result unless s landed exactly on a
// float midpoint (the exact value may lie to either side of it; whatever
// lands elsewhere rounds to float as the exact value does). Lanes on a
// midpoint are rare and go to std::fma, which rounds once as well. Below
// 2^-126 the midpoints sit higher in s than a normal float's: c a subnormal
// near 2^-127 with a product near 2^-150 lands on one (the exact sum spans
// 70 bits).
inline RegF FmaRegister(RegF a, RegF b, RegF c) {
  const auto half = [&](auto first) {
    constexpr int kFirst = decltype(first)::value;
    const RegD p = _mm_cvtps_pd(kFirst ? _mm_movehl_ps(a, a) : a) *
                   _mm_cvtps_pd(kFirst ? _mm_movehl_ps(b, b) : b);
    return p + _mm_cvtps_pd(kFirst ? _mm_movehl_ps(c, c) : c);
  };
  const RegD low = half(std::integral_constant<int, 0>{});
  const RegD high = half(std::integral_constant<int, 2>{});
  RegF out = _mm_movelh_ps(_mm_cvtpd_ps(low), _mm_cvtpd_ps(high));
  // What every lane OnFloatMidpoint takes has, in the 29 bits below
  // float's mantissa: 1000...0 (a normal float's midpoint), or all zeros
  // with s below 2^-126 (a subnormal's, whose halfway bit is higher). Most
  // lanes have neither, and skip the lane-by-lane look.
  const auto maybe_midpoint = [](RegD s) {
    constexpr double kSmallestNormal = std::numeric_limits<float>::min();
    const RegL low_bits = std::bit_cast<RegL>(s) & 0x1fffffff;
    return (low_bits == 0x10000000) |
           ((low_bits == 0) & (s > -kSmallestNormal) & (s < kSmallestNormal) &
            (s != 0));
  };
  const RegL low_maybe = maybe_midpoint(low), high_maybe = maybe_midpoint(high);
  if ((low_maybe[0] | low_maybe[1] | high_maybe[0] | high_maybe[1]) != 0) {
    for (int l = 0; l < 4; ++l) {
      if (OnFloatMidpoint(l < 2 ? low[l] : high[l - 2])) {
        out[l] = std::fma(a[l], b[l], c[l]);
      }
    }
  }
  return out;
}
#endif

// a * b + c, rounded once. The project builds with -ffp-contract=off, so this
// is the only place a multiply and an add fuse, and every copy of an
// expression rounds alike, whatever the variant.
inline RegF Fma(RegF a, RegF b, RegF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return FmaRegister(a, b, c);
#endif
}
inline VecF Fma(VecF a, VecF b, VecF c) {
  return EachPart(
      [&](size_t p) -> RegF { return Fma(a.part[p], b.part[p], c.part[p]); });
}

// Select (wide.h) on one register.
inline RegF Select(RegI mask, RegF a, RegF b) { return mask ? a : b; }

inline bool Any(VecI mask) {
  int32_t acc = 0;
  for (int l = 0; l < kLanes; ++l) acc |= mask[l];
  return acc != 0;
}
inline bool Any(RegI mask) {
  int32_t acc = 0;
  for (int l = 0; l < VecI::kPartLanes; ++l) acc |= mask[l];
  return acc != 0;
}

// The largest lane of a running max (MaxOfParts). Each variant folds the
// lanes in its own order, which can matter only to the sign of a zero
// maximum (maxps keeps its second operand on a tie): + 0.0f makes that
// zero +0 in every variant.
inline float ReduceMax(RegF v) {
  float m = v[0];
  for (int l = 1; l < VecF::kPartLanes; ++l) m = v[l] > m ? v[l] : m;
  return m + 0.0f;
}

inline double ReduceSum(VecD v) {
  double s = 0;
  for (int l = 0; l < kLanes / 2; ++l) s += v[l];
  return s;
}

// Sum of the lanes of v, in double.
inline VecD WideSum(VecF v) { return WidenLow(v) + WidenHigh(v); }
// Lane products of a and b, exact in double, then summed pairwise.
inline VecD WideDot(VecF a, VecF b) {
  return WidenLow(a) * WidenLow(b) + WidenHigh(a) * WidenHigh(b);
}

// Four doubles: a running sum that takes one register in the AVX2 and
// AVX-512 variants (two in the baseline), where an 8-lane VecD takes two
// in AVX2, whose 16 registers a loop with several sums must share.
using QuadD = double __attribute__((vector_size(32)));

// Lanes [0, 4) of v plus lanes [4, 8).
inline QuadD FoldToQuad(VecD v) {
#if defined(__AVX512F__)
  return __builtin_shufflevector(v.part[0], v.part[0], 0, 1, 2, 3) +
         __builtin_shufflevector(v.part[0], v.part[0], 4, 5, 6, 7);
#elif defined(__AVX__)
  return v.part[0] + v.part[1];
#else
  return __builtin_shufflevector(v.part[0] + v.part[2], v.part[1] + v.part[3],
                                 0, 1, 2, 3);
#endif
}

inline double ReduceSum(QuadD v) { return ((v[0] + v[1]) + v[2]) + v[3]; }

// The top of Exp's domain: e^88 is below FLT_MAX (e^88.72).
inline constexpr float kExpDomainTop = 88.0f;

// exp(x) for x <= kExpDomainTop: a softmax's x - max <= 0 needs no cap,
// which cost an instruction per register; a caller with larger x caps it.
// Inputs below ln(FLT_MIN) give 0 (no denormals), -inf gives 0, NaN NaN.
// With kHeadroom > 0 it gives 2^kHeadroom exp(x), for x up to
// ExpDomainTop(kHeadroom) and 0 below ln(2^-(126 + kHeadroom)): the same
// bits times 2^kHeadroom wherever exp(x) alone is not 0, and where exp(x)
// would be a subnormal, 2^kHeadroom exp(x) with all its bits but within a
// rounding of the bound (kSoftmaxHeadroom).
// x = n ln2 + r with |r| <= ln2/2; exp(r) = 1 + r + r^2 Q(r), Q of degree
// 4 fitted for the least maximum relative error in float64 (3.1e-9; the
// degree-7 Taylor polynomial it replaced, 5e-9 with one step more); 2^n
// through the exponent bits. Evaluated in float: 1.28 ulp at worst over a
// sweep of [-87.3, 0] (the Taylor form: 1.30).
// F is VecF, or one register of it (RegF), for a loop that computes a vector
// part by part to hold fewer values at once; the same operations either way.
template <int kHeadroom = 0, typename F>
inline F Exp(F x) {
  static_assert(kHeadroom >= 0 && kHeadroom <= 23,
                "2^-(126 + kHeadroom) must be a float, and n + 127 + "
                "kHeadroom below 2^23 t's low bits");
  using I = decltype(x < x);
  const auto c = [](float v) {
    if constexpr (std::is_same_v<F, VecF>) {
      return Splat(v);
    } else {
      return SplatRegister(v);
    }
  };
  // Adding 1.5 * 2^23 rounds x log2(e) to an integer n in t's low mantissa
  // bits, and 127 more makes them n + 127, 2^n's exponent field, with no
  // integer add of its own (kHeadroom more make them 2^(n + kHeadroom)'s;
  // an integer added to a float of [2^23, 2^24) is exact, so n is the same
  // with any headroom). Only a tie could round otherwise than 1.5 * 2^23
  // alone did, and there is none in Exp's domain: log2(e)'s float has an
  // odd significand, so x log2(e) lies halfway between integers only for
  // |x| of 2^22 or more.
  const F shifter = c(12583039.0f + kHeadroom);  // 1.5 * 2^23 + 127
  const F t = Fma(x, c(1.44269504088896341f), shifter);
  const F n = t - shifter;
  F r = Fma(n, c(-0.693359375f), x);
  r = Fma(n, c(2.12194440e-4f), r);
  F p = c(0.0013814496342092752f);
  p = Fma(p, r, c(0.008368694223463535f));
  p = Fma(p, r, c(0.04166838899254799f));
  p = Fma(p, r, c(0.1666652113199234f));
  p = Fma(p, r, c(0.4999999403953552f));
  p = Fma(p, r, c(1.0f));
  p = Fma(p, r, c(1.0f));
  // 2^n: t's low bits shifted into the exponent field, its others off the
  // top. A multiply, not an add to p's exponent field, which would turn a
  // NaN into a number.
  const F scaled = p * std::bit_cast<F>(std::bit_cast<I>(t) << 23);
  // Below it n + 127 + kHeadroom would leave the exponent field. For no
  // headroom the bound is ln(FLT_MIN), as a float above it, so that no
  // result is subnormal.
  constexpr float kBottom =
      kHeadroom == 0 ? -87.33654f : -(126 + kHeadroom) * 0.693147182f;
  return Select(x < c(kBottom), c(0.0f), scaled);
}

// The top of Exp<kHeadroom>'s domain: 2^kHeadroom e^top below FLT_MAX.
constexpr float ExpDomainTop(int headroom) {
  return kExpDomainTop - headroom * 0.693147182f;
}

// log(x) split as exponent * ln2 + mantissa_log, with mantissa_log in
// [-0.35, 0.35]. Keeping the parts apart lets callers accumulate
// sum(w log w) without rounding the large part.
struct LogParts {
  VecF exponent;
  VecF mantissa_log;
};

inline constexpr float kFloatMin = 1.17549435e-38f;  // the smallest normal

// For normal x > 0, and x = 0 (which gives finite parts, for callers that
// multiply them by x): x = 2^e * m with m in [sqrt(1/2), sqrt(2)), read off
// the bits (less sqrt(1/2)'s bits, the exponent field is e), so
// log x = e ln2 + log(1 + f), f = m - 1.
inline LogParts LogSplitNormal(VecF x) {
  // Unsigned, so that the bits of a negative x (a bad weight, reported by
  // the caller) wrap rather than overflow; the shift of e is arithmetic.
  const VecU bits = std::bit_cast<VecU>(x);
  const VecI e = std::bit_cast<VecI>(bits - 0x3f3504f3u) >> 23;
  const VecF f =
      std::bit_cast<VecF>(bits - (std::bit_cast<VecU>(e) << 23)) - Splat(1.0f);
  // log(1+f) = f - f^2/2 + f^3 P(f), f in [-0.293, 0.414); P of degree 6
  // fitted for the least maximum error in float64 (7e-9 on the interval).
  // Evaluated in float, 2.7e-8 at worst over a sweep of the normal floats,
  // where the degree-8 P it replaced gave 2.1e-8: the float rounding
  // dominates either way, and about one ulp of |log(1+f)| <= 0.35 is 3e-8.
  VecF p = Splat(0.08670959621667862f);
  p = Fma(p, f, Splat(-0.14377671480178833f));
  p = Fma(p, f, Splat(0.14977824687957764f));
  p = Fma(p, f, Splat(-0.16564588248729706f));
  p = Fma(p, f, Splat(0.19954907894134521f));
  p = Fma(p, f, Splat(-0.2500169277191162f));
  p = Fma(p, f, Splat(0.33334165811538696f));
  const VecF f2 = f * f;
  return {Convert<RegF>(e), Fma(f2, Fma(f, p, Splat(-0.5f)), f)};
}

// Any x >= 0, subnormals included: those are scaled by 2^23 first. For a
// normal x the same bits as LogSplitNormal.
inline LogParts LogSplit(VecF x) {
  const VecI subnormal = x < Splat(kFloatMin);
  LogParts parts = LogSplitNormal(Select(subnormal, x * Splat(8388608.0f), x));
  parts.exponent =
      parts.exponent - Select(subnormal, Splat(23.0f), Splat(0.0f));
  return parts;
}

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_VEC_MATH_H_
