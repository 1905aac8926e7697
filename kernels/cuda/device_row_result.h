#ifndef KLSERVE_KERNELS_CUDA_DEVICE_ROW_RESULT_H_
#define KLSERVE_KERNELS_CUDA_DEVICE_ROW_RESULT_H_

// What the row kernel writes for each row, read back by the host: shared by
// device and host code, so plain C++ only.

#include <cstdint>

#include "kernels/row_rules.h"

namespace klserve::cuda {

struct DeviceRowResult {
  double kl;         // unscaled KL (kComputed rows)
  double entropy_p;  // diagnostics
  double entropy_q;
  double recall;
  int64_t error_slot;  // j of the error, when it names a slot
  int32_t error_head;  // h, for the attention_logits errors
  uint8_t kind;        // RowResult::Kind, as its integer value
  uint8_t error;       // RowError (kernels/row_rules.h)
  uint8_t padding[2];
};
static_assert(sizeof(DeviceRowResult) == 48, "no hidden padding");

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_DEVICE_ROW_RESULT_H_
