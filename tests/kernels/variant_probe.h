#ifndef KLSERVE_TESTS_KERNELS_VARIANT_PROBE_H_
#define KLSERVE_TESTS_KERNELS_VARIANT_PROBE_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/dtype.h"

// Pieces of one ISA variant's kernels, reached from a test: variant_probe.cc
// is compiled once per variant with the variant's flags, as the kernels are.

namespace klserve::testdata {

struct VariantProbe {
  // a * b + c as written, compiled with the variant's flags (FMA where it
  // has it): the build must not fuse it.
  float (*mul_add)(float a, float b, float c);
  // The kernels' Fma, Exp (of x capped at 88, its domain) and LogSplit on
  // 16 lanes.
  void (*fma)(const float* a, const float* b, const float* c, float* out);
  void (*exp)(const float* x, float* out);
  void (*log_split)(const float* x, float* exponent, float* mantissa_log);
  // The kernels' row conversions (kernels/cpu/variant/row_convert.h).
  const float* (*float_row)(DType dtype, const std::byte* data, int64_t n,
                            float* scratch);
  void (*store_float_row)(const float* src, int64_t n, DType dtype,
                          std::byte* dst);
};

const VariantProbe& ProbeFor(cpu::Isa isa);

}  // namespace klserve::testdata

#endif  // KLSERVE_TESTS_KERNELS_VARIANT_PROBE_H_
