#ifndef KLSERVE_KERNELS_STOP_CHECK_H_
#define KLSERVE_KERNELS_STOP_CHECK_H_

#include <functional>

#include "absl/status/status.h"

namespace klserve {

// Asked between steps of a projections computation whether to go on. A
// status that is not OK (the caller gone, a time limit passed) ends the
// computation with it: a projections problem's work grows with T * S * H * D
// from a message that grows with their sums, so a caller that has left could
// otherwise hold a compute thread for hours. Asked within a tile, not only
// between tiles, as one tile of a row against many keys and heads is already
// that much work (kernels/cpu/variant/projection_steps.h). Called from any of
// the backend's threads.
using StopCheck = std::function<absl::Status()>;

}  // namespace klserve

#endif  // KLSERVE_KERNELS_STOP_CHECK_H_
