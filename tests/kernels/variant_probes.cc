#include "tests/kernels/variant_probe.h"

namespace klserve {
namespace cpu {
// Each defined by its variant's copy of variant_probe.cc.
namespace baseline {
extern const testdata::VariantProbe kVariantProbe;
}
namespace avx2 {
extern const testdata::VariantProbe kVariantProbe;
}
namespace avx512 {
extern const testdata::VariantProbe kVariantProbe;
}
}  // namespace cpu

namespace testdata {

const VariantProbe& ProbeFor(cpu::Isa isa) {
  return cpu::ForIsa(isa, cpu::baseline::kVariantProbe,
                     cpu::avx2::kVariantProbe, cpu::avx512::kVariantProbe);
}

}  // namespace testdata
}  // namespace klserve
