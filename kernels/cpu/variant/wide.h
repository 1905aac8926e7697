#ifndef KLSERVE_KERNELS_CPU_VARIANT_WIDE_H_
#define KLSERVE_KERNELS_CPU_VARIANT_WIDE_H_

// The vector type of the CPU kernels: 64 bytes held in the variant's
// registers, one AVX-512 register, two AVX2 ones or four SSE ones. Every
// variant computes on the same 64-byte vectors, lane for lane, so they all
// do the same operations in the same order and give the same bits; only the
// number of instructions per operation differs.
//
// Not GCC's 64-byte vector types themselves: without AVX-512, GCC turns many
// of their operations (compares, selects) into one scalar instruction per
// lane. A Wide applies each operation register by register instead, with the
// register's own vector type, which every variant compiles natively.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cpu/variant/isa_namespace.h"

namespace klserve::cpu::KLSERVE_ISA {

#if defined(__AVX512F__)
inline constexpr int kRegisterBytes = 64;
#elif defined(__AVX__)
inline constexpr int kRegisterBytes = 32;
#else
inline constexpr int kRegisterBytes = 16;
#endif
inline constexpr int kWideBytes = 64;
inline constexpr int kParts = kWideBytes / kRegisterBytes;

// One register of each element type, as GCC vector types.
using RegF = float __attribute__((vector_size(kRegisterBytes)));
using RegI = int32_t __attribute__((vector_size(kRegisterBytes)));
using RegU = uint32_t __attribute__((vector_size(kRegisterBytes)));
using RegD = double __attribute__((vector_size(kRegisterBytes)));
using RegL = int64_t __attribute__((vector_size(kRegisterBytes)));

// kParts registers of type R acting as one 64-byte vector. Lane i lies in
// part i / kPartLanes.
template <typename R>
struct Wide {
  using Lane = std::remove_cvref_t<decltype(R{}[0])>;
  static constexpr int kPartLanes = sizeof(R) / sizeof(Lane);
  static constexpr int kSize = kParts * kPartLanes;

  R part[kParts];

  Lane operator[](int i) const { return part[i / kPartLanes][i % kPartLanes]; }
  void Set(int i, Lane v) { part[i / kPartLanes][i % kPartLanes] = v; }
};

// f(part index) for each part, as a Wide of what f returns. The index comes
// as a std::integral_constant, so that f may use it where a constant is
// needed (a shuffle's lane numbers).
template <typename F, size_t... P>
inline auto EachPart(F&& f, std::index_sequence<P...>) {
  using R = decltype(f(std::integral_constant<size_t, 0>{}));
  return Wide<R>{{f(std::integral_constant<size_t, P>{})...}};
}
template <typename F>
inline auto EachPart(F&& f) {
  return EachPart(f, std::make_index_sequence<kParts>{});
}

// f(part index) for each part, for its effects.
template <typename F, size_t... P>
inline void ForEachPart(F&& f, std::index_sequence<P...>) {
  (f(std::integral_constant<size_t, P>{}), ...);
}
template <typename F>
inline void ForEachPart(F&& f) {
  ForEachPart(f, std::make_index_sequence<kParts>{});
}

// The operators of GCC's vector types, part by part: arithmetic, bitwise,
// shifts and compares (which give the lane masks of GCC's compares, -1 true
// and 0 false), between two Wides or a Wide and one lane value.
#define KLSERVE_WIDE_BINARY_OPERATOR(op)                                \
  template <typename R>                                                 \
  inline auto operator op(const Wide<R>& a, const Wide<R>& b) {         \
    return EachPart([&](size_t p) { return a.part[p] op b.part[p]; });  \
  }                                                                     \
  template <typename R>                                                 \
  inline auto operator op(const Wide<R>& a, typename Wide<R>::Lane s) { \
    return EachPart([&](size_t p) { return a.part[p] op s; });          \
  }                                                                     \
  template <typename R>                                                 \
  inline auto operator op(typename Wide<R>::Lane s, const Wide<R>& b) { \
    return EachPart([&](size_t p) { return s op b.part[p]; });          \
  }
KLSERVE_WIDE_BINARY_OPERATOR(+)
KLSERVE_WIDE_BINARY_OPERATOR(-)
KLSERVE_WIDE_BINARY_OPERATOR(*)
KLSERVE_WIDE_BINARY_OPERATOR(/)
KLSERVE_WIDE_BINARY_OPERATOR(&)
KLSERVE_WIDE_BINARY_OPERATOR(|)
KLSERVE_WIDE_BINARY_OPERATOR(<<)
KLSERVE_WIDE_BINARY_OPERATOR(>>)
KLSERVE_WIDE_BINARY_OPERATOR(<)
KLSERVE_WIDE_BINARY_OPERATOR(>)
KLSERVE_WIDE_BINARY_OPERATOR(<=)
KLSERVE_WIDE_BINARY_OPERATOR(>=)
KLSERVE_WIDE_BINARY_OPERATOR(==)
KLSERVE_WIDE_BINARY_OPERATOR(!=)
#undef KLSERVE_WIDE_BINARY_OPERATOR

#define KLSERVE_WIDE_ASSIGN_OPERATOR(op)                   \
  template <typename R, typename B>                        \
  inline Wide<R>& operator op##=(Wide<R>& a, const B& b) { \
    a = a op b;                                            \
    return a;                                              \
  }
KLSERVE_WIDE_ASSIGN_OPERATOR(+)
KLSERVE_WIDE_ASSIGN_OPERATOR(&)
KLSERVE_WIDE_ASSIGN_OPERATOR(|)
#undef KLSERVE_WIDE_ASSIGN_OPERATOR

template <typename R>
inline Wide<R> operator-(const Wide<R>& a) {
  return EachPart([&](size_t p) { return -a.part[p]; });
}
template <typename R>
inline Wide<R> operator~(const Wide<R>& a) {
  return EachPart([&](size_t p) { return ~a.part[p]; });
}

// a where `mask` is -1, b where it is 0.
template <typename M, typename R>
inline Wide<R> Select(const Wide<M>& mask, const Wide<R>& a, const Wide<R>& b) {
  return EachPart(
      [&](size_t p) { return mask.part[p] ? a.part[p] : b.part[p]; });
}

// Lane-wise conversion to another element type of the same size (int32 to
// float), as __builtin_convertvector converts.
template <typename To, typename R>
inline Wide<To> Convert(const Wide<R>& a) {
  return EachPart(
      [&](size_t p) { return __builtin_convertvector(a.part[p], To); });
}

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_WIDE_H_
