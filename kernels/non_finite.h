#ifndef KLSERVE_KERNELS_NON_FINITE_H_
#define KLSERVE_KERNELS_NON_FINITE_H_

// Finding a NaN or an infinity in a float tensor's bytes: the check of
// inputs the service cannot trust (the projections) and of outputs computed
// from inputs that may have changed under the computation (shared memory).

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace klserve {

// The index of the first NaN or infinity (or, with `infinities_allowed`,
// the first NaN) of the n floats of `dtype` at `data` (any alignment), or
// -1; -1 for a dtype that is not a float. Blocks of a loop that vectorises;
// the exact index only for a block that has one.
int64_t FirstNonFinite(DType dtype, const std::byte* data, int64_t n,
                       bool infinities_allowed);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_NON_FINITE_H_
