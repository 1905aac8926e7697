// Compiled once per ISA variant (tests/kernels/CMakeLists.txt); each copy
// fills the VariantProbe of its variant.

#include "tests/kernels/variant_probe.h"

#include <algorithm>

#include "kernels/cpu/variant/row_convert.h"
#include "kernels/cpu/variant/vec_math.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

float MulAdd(float a, float b, float c) { return a * b + c; }

void FmaLanes(const float* a, const float* b, const float* c, float* out) {
  Store(out, Fma(Load(a), Load(b), Load(c)));
}
// The test's inputs past Exp's domain are capped at its top.
void ExpLanes(const float* x, float* out) {
  float capped[kLanes];
  for (int l = 0; l < kLanes; ++l) capped[l] = std::min(x[l], kExpDomainTop);
  Store(out, Exp(Load(capped)));
}
void LogSplitLanes(const float* x, float* exponent, float* mantissa_log) {
  const LogParts parts = LogSplit(Load(x));
  Store(exponent, parts.exponent);
  Store(mantissa_log, parts.mantissa_log);
}

}  // namespace

extern const testdata::VariantProbe kVariantProbe;
const testdata::VariantProbe kVariantProbe = {
    &MulAdd, &FmaLanes, &ExpLanes, &LogSplitLanes, &FloatRow, &StoreFloatRow};

}  // namespace klserve::cpu::KLSERVE_ISA
