#ifndef KLSERVE_KERNELS_CPU_VEC_MATH_H_
#define KLSERVE_KERNELS_CPU_VEC_MATH_H_

// SIMD primitives for the CPU backend, written once with GCC vector
// extensions: the width follows the target ISA (16 lanes with AVX-512, 8 with
// AVX2, 4 otherwise). exp and log are our own polynomial approximations
// (about 1 ulp on the ranges used here); libm's scalar expf is ~15x slower on
// this machine and libmvec would tie results to the glibc version.
//
// Loads and stores take unaligned pointers. A row's last, partial vector goes
// through LoadPart/StorePart so that every element uses the same formula.

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace klserve::cpu {

#if defined(__AVX512F__)
inline constexpr int kLanes = 16;
#elif defined(__AVX2__)
inline constexpr int kLanes = 8;
#else
inline constexpr int kLanes = 4;
#endif

using VecF = float __attribute__((vector_size(kLanes * 4)));
using VecI = int32_t __attribute__((vector_size(kLanes * 4)));
using VecD = double __attribute__((vector_size(kLanes * 4)));  // kLanes/2
using HalfF = float __attribute__((vector_size(kLanes * 2)));
using VecB = uint8_t __attribute__((vector_size(kLanes)));
using VecFu = float __attribute__((vector_size(kLanes * 4), aligned(4)));
using VecBu = uint8_t __attribute__((vector_size(kLanes), aligned(1)));

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline VecF Splat(float v) { return VecF{} + v; }
inline VecI SplatI(int32_t v) { return VecI{} + v; }

inline VecF Load(const float* p) { return *reinterpret_cast<const VecFu*>(p); }
inline void Store(float* p, VecF v) { *reinterpret_cast<VecFu*>(p) = v; }

// A store that bypasses the cache, for output the row will not read again
// (no read-for-ownership of the destination line). `p` must be aligned to the
// vector size; FinishStreamingStores orders them before later stores.
inline void StoreStream(float* p, VecF v) {
#if defined(__AVX512F__)
  _mm512_stream_ps(p, v);
#elif defined(__AVX__)
  _mm256_stream_ps(p, v);
#else
  _mm_stream_ps(p, v);
#endif
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

// Validity bytes (nonzero = valid) as lane masks: -1 valid, 0 not.
inline VecI LoadValid(const uint8_t* p) {
  const VecB b = *reinterpret_cast<const VecBu*>(p);
  return __builtin_convertvector(b, VecI) != 0;
}
inline VecI LoadValidPart(const uint8_t* p, int64_t count) {
  VecB b{};
  std::memcpy(&b, p, count);
  return __builtin_convertvector(b, VecI) != 0;
}

// -1 in lanes whose index i + lane is below `limit`.
inline VecI LanesBelow(int64_t i, int64_t limit) {
  VecI iota;
  for (int l = 0; l < kLanes; ++l) iota[l] = l;
  const int64_t room = limit - i;
  const int32_t r = room > kLanes ? kLanes : (room < 0 ? 0 : int32_t(room));
  return iota < r;
}

inline VecF Select(VecI mask, VecF a, VecF b) { return mask ? a : b; }

// a * b + c, rounded once where the ISA has FMA. The project builds with
// -ffp-contract=off, so this is the only place a multiply and an add fuse and
// every copy of an expression rounds alike.
inline VecF Fma(VecF a, VecF b, VecF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

inline bool Any(VecI mask) {
  int32_t acc = 0;
  for (int l = 0; l < kLanes; ++l) acc |= mask[l];
  return acc != 0;
}

inline float ReduceMax(VecF v) {
  float m = v[0];
  for (int l = 1; l < kLanes; ++l) m = v[l] > m ? v[l] : m;
  return m;
}

inline double ReduceSum(VecD v) {
  double s = 0;
  for (int l = 0; l < kLanes / 2; ++l) s += v[l];
  return s;
}

template <size_t... I>
inline HalfF LowHalf(VecF v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, I...);
}
template <size_t... I>
inline HalfF HighHalf(VecF v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (I + kLanes / 2)...);
}
#if defined(__AVX512DQ__)
// GCC splits the generic conversion into 128-bit pieces; the intrinsics give
// one vcvtps2pd per half.
inline VecD WidenLow(VecF v) {
  return _mm512_maskz_cvtps_pd(0xff, _mm512_extractf32x8_ps(v, 0));
}
inline VecD WidenHigh(VecF v) {
  return _mm512_maskz_cvtps_pd(0xff, _mm512_extractf32x8_ps(v, 1));
}
#else
inline VecD WidenLow(VecF v) {
  return __builtin_convertvector(
      LowHalf(v, std::make_index_sequence<kLanes / 2>{}), VecD);
}
inline VecD WidenHigh(VecF v) {
  return __builtin_convertvector(
      HighHalf(v, std::make_index_sequence<kLanes / 2>{}), VecD);
}
#endif

// Sum of the lanes of v, in double.
inline VecD WideSum(VecF v) { return WidenLow(v) + WidenHigh(v); }
// Lane products of a and b, exact in double, then summed pairwise.
inline VecD WideDot(VecF a, VecF b) {
  return WidenLow(a) * WidenLow(b) + WidenHigh(a) * WidenHigh(b);
}

// exp(x). Inputs below ln(FLT_MIN) give 0 (no denormals), -inf gives 0.
// x = n ln2 + r with |r| <= ln2/2; exp(r) by its degree-7 Taylor polynomial
// (truncation error below 1e-8 relative), 2^n through the exponent bits.
inline VecF Exp(VecF x) {
  const VecF xc = x < Splat(88.0f) ? x : Splat(88.0f);
  const VecF shifter = Splat(12582912.0f);  // 1.5 * 2^23 rounds to integer
  const VecF t = Fma(xc, Splat(1.44269504088896341f), shifter);
  const VecF n = t - shifter;
  const VecI ni = std::bit_cast<VecI>(t) - 0x4b400000;
  VecF r = Fma(n, Splat(-0.693359375f), xc);
  r = Fma(n, Splat(2.12194440e-4f), r);
  VecF p = Splat(1.0f / 5040);
  p = Fma(p, r, Splat(1.0f / 720));
  p = Fma(p, r, Splat(1.0f / 120));
  p = Fma(p, r, Splat(1.0f / 24));
  p = Fma(p, r, Splat(1.0f / 6));
  p = Fma(p, r, Splat(0.5f));
  p = Fma(p, r, Splat(1.0f));
  p = Fma(p, r, Splat(1.0f));
  const VecI bits = (ni + 127) << 23;
  const VecF scale = std::bit_cast<VecF>(bits);
  return Select(x < Splat(-87.33654f), Splat(0.0f), p * scale);
}

// log(x) for x > 0 (denormals included), split as exponent * ln2 +
// mantissa_log with mantissa_log in [-0.35, 0.35]. Keeping the parts apart
// lets callers accumulate sum(w log w) without rounding the large part.
struct LogParts {
  VecF exponent;
  VecF mantissa_log;
};

inline LogParts LogSplit(VecF x) {
  const VecI denormal = x < Splat(1.17549435e-38f);
  x = Select(denormal, x * Splat(8388608.0f), x);  // * 2^23
  const VecI bits = std::bit_cast<VecI>(x);
  VecI e = ((bits >> 23) & 0xff) - 126 + (denormal & -23);
  VecI mbits = (bits & 0x007fffff) | 0x3f000000;  // mantissa in [0.5, 1)
  VecF m = std::bit_cast<VecF>(mbits);
  const VecI small = m < Splat(0.70710678f);
  e = e + small;  // small lanes are -1
  m = Select(small, m + m, m);
  const VecF f = m - Splat(1.0f);  // in [-0.293, 0.414)
  // log(1+f) = f - f^2/2 + f^3 P(f); P fitted by least squares in float64
  // (max error 2.7e-9 on the interval).
  VecF p = Splat(0.07149679213762283f);
  p = Fma(p, f, Splat(-0.11571265757083893f));
  p = Fma(p, f, Splat(0.11661573499441147f));
  p = Fma(p, f, Splat(-0.12411043792963028f));
  p = Fma(p, f, Splat(0.14249928295612335f));
  p = Fma(p, f, Splat(-0.1666848063468933f));
  p = Fma(p, f, Splat(0.20000708103179932f));
  p = Fma(p, f, Splat(-0.24999989569187164f));
  p = Fma(p, f, Splat(0.3333333134651184f));
  const VecF f2 = f * f;
  const VecF ml = f + (f2 * f * p - Splat(0.5f) * f2);
  return {__builtin_convertvector(e, VecF), ml};
}

// log(x) for x >= 0 in float; log(0) = -inf.
inline VecF Log(VecF x) {
  const LogParts parts = LogSplit(x);
  const VecF y = parts.exponent * Splat(0.693359375f) +
                 (parts.mantissa_log + parts.exponent * Splat(-2.12194440e-4f));
  return Select(x == Splat(0.0f), Splat(-kInf), y);
}

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_VEC_MATH_H_
