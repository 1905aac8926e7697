#ifndef KLSERVE_KERNELS_INPUT_DTYPES_H_
#define KLSERVE_KERNELS_INPUT_DTYPES_H_

#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace klserve {

// Which dtypes an input tensor may have. Each input's rule is written once,
// in input_dtype below: the kernels check the tensor against it, and the
// request table (proto/request_tensors.h) reads it for klctl's help, the
// clients' .npy reader and the stream slicer. Header-only, as the client
// reads it without linking the kernels.
enum class DTypeRule {
  kFloat,  // FP32, BF16 or FP16
  kFloat32,
  kInt32,
  kBool,  // one byte per element, nonzero is true
};

inline constexpr DType kFloat32DType[] = {DType::kFloat32};
inline constexpr DType kInt32DType[] = {DType::kInt32};
inline constexpr DType kBoolDType[] = {DType::kBool};

// The dtypes `rule` takes, in the order a message lists them.
constexpr absl::Span<const DType> DTypesOf(DTypeRule rule) {
  switch (rule) {
    case DTypeRule::kFloat:
      return kFloatDTypes;
    case DTypeRule::kFloat32:
      return kFloat32DType;
    case DTypeRule::kInt32:
      return kInt32DType;
    case DTypeRule::kBool:
      return kBoolDType;
  }
  return {};
}

// Each input's rule, by its fields in IndexerKlInputs and ProjectionsInputs.
namespace input_dtype {
// attention_logits, attention_weights and indexer_scores: values.
inline constexpr DTypeRule kScores = DTypeRule::kFloat;
// query, key, index_query, index_key and index_weights.
inline constexpr DTypeRule kProjection = DTypeRule::kFloat;
// lse, each head's log-sum-exp: FP32, in which attention kernels keep it
// (FlashAttention's softmax_lse).
inline constexpr DTypeRule kLse = DTypeRule::kFloat32;
// topk_indices, segment_ids_q and segment_ids_kv, key_start and key_end.
inline constexpr DTypeRule kIndex = DTypeRule::kInt32;
// attention_mask, key_padding_mask and row_valid.
inline constexpr DTypeRule kMask = DTypeRule::kBool;
}  // namespace input_dtype

}  // namespace klserve

#endif  // KLSERVE_KERNELS_INPUT_DTYPES_H_
