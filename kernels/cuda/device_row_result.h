#ifndef KLSERVE_KERNELS_CUDA_DEVICE_ROW_RESULT_H_
#define KLSERVE_KERNELS_CUDA_DEVICE_ROW_RESULT_H_

// What the row kernel writes for each row, read back by the host: shared by
// device and host code, so plain C++ only.

#include <cstdint>

namespace klserve::cuda {

// The value rules a row can break on the device, in the order the CPU backend
// checks them within a row (the index rules are checked on the host first).
enum class RowError : uint8_t {
  kNone = 0,
  kLogitsNotFinite,    // attention_logits: NaN or +inf at (head, slot)
  kLogitsAllMinusInf,  // attention_logits: a head is -inf at every valid key
  kWeightsBad,         // attention_weights: NaN, negative or +inf at slot
  kScoresNotFinite,    // indexer_scores: NaN or +inf at slot
  kScoresAllMinusInf,  // indexer_scores: -inf at every valid key
  kMinusInfWithMass,   // EXACT: score -inf at a slot where p > 0
};

struct DeviceRowResult {
  double kl;         // unscaled KL (kComputed rows)
  double entropy_p;  // diagnostics
  double entropy_q;
  double recall;
  int64_t error_slot;  // j of the error, when it names a slot
  int32_t error_head;  // h, for the attention_logits errors
  uint8_t kind;        // RowResult::Kind, as its integer value
  uint8_t error;       // RowError
  uint8_t padding[2];
};
static_assert(sizeof(DeviceRowResult) == 48, "no hidden padding");

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_DEVICE_ROW_RESULT_H_
