#include "kernels/cpu/isa_kernels.h"

namespace klserve::cpu {

// Each defined by its variant's kernels/cpu/variant/rows.cc.
namespace baseline {
extern const IsaKernels kIsaKernels;
}
namespace avx2 {
extern const IsaKernels kIsaKernels;
}
namespace avx512 {
extern const IsaKernels kIsaKernels;
}

const IsaKernels& KernelsFor(Isa isa) {
  return ForIsa(isa, baseline::kIsaKernels, avx2::kIsaKernels,
                avx512::kIsaKernels);
}

}  // namespace klserve::cpu
