#ifndef KLSERVE_PROTO_REQUEST_TENSORS_H_
#define KLSERVE_PROTO_REQUEST_TENSORS_H_

// The request's tensors, named once. Whatever handles them one by one (the
// server's codec, its size limits and stream reactor, the client's stream
// slicer, klctl, the tests' harness) iterates kRequestTensors, so a tensor
// cannot be left out of one of them. Adding a tensor is one entry here, its
// field in proto/klserve/v1/klserve.proto (ComputeLossRequest, StreamHeader
// and, when per-row, RowBlock), its member of IndexerKlInputs and its use in
// the kernels (for a per-row tensor also its slot in RowBlockBytes, filled
// by server/codec/tensor_codec.cc's BlockBytesOf), and its flag in client/klctl.cc
// (a flag is a macro, so it is written out; klctl refuses a loss call while
// one is missing). tests/proto/request_tensors_test.cc fails until the table
// and the proto agree.
//
// Shared by the server and the client libraries; needs no kernels code
// (IndexerKlInputs is named only through member pointers).

#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/problem.h"
#include "kernels/tensor_view.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve {

enum class TensorRole {
  // As large as the problem, one slice per row (b, t): streamed in the
  // RowBlocks (the StreamHeader holds its TensorSpec), and each block's
  // bytes are held to the tensor limit.
  kPerRow,
  // Per batch entry ([B, T] or [B, S]): sent whole, in the StreamHeader too.
  kSmall,
};

// The dtypes a tensor may have (the kernels check them).
enum class DTypeRule {
  kFloat,  // FP32, BF16 or FP16
  kInt32,
  kBool,  // one byte per element, nonzero is true
};

// A tensor's member of IndexerKlInputs: optional, or a plain view for the
// one tensor every request must carry.
using OptionalInput = std::optional<TensorView> IndexerKlInputs::*;
using RequiredInput = TensorView IndexerKlInputs::*;

struct RequestTensor {
  // The field's name in ComputeLossRequest (a Tensor), StreamHeader (a
  // TensorSpec when per-row, else a Tensor) and, when per-row, RowBlock
  // (bytes). The accessors below find the fields by this name.
  absl::string_view name;
  TensorRole role;
  DTypeRule dtype;
  // Letters as in klserve.proto: B batch, H heads, T query rows, S keys,
  // K top-k slots.
  absl::string_view layout;
  // Per-row: the layout of a RowBlock's bytes of num_rows rows; else empty.
  absl::string_view block_layout;
  // Per-row with a head axis: [B, H, T, X], blocks head-major [H, n, X].
  bool per_head;
  std::variant<OptionalInput, RequiredInput> input;
  // Per-row: the RowBlock's bytes for writing, else null. A function, as
  // protobuf's reflection writes a bytes field only by replacing its string,
  // and the client refills one block's strings to keep their capacity.
  std::string* (*mutable_block_bytes)(v1::RowBlock& block);
};

// In the order the server validates them: a request with several bad
// tensors is told about the first.
inline constexpr RequestTensor kRequestTensors[] = {
    {.name = "attention_logits",
     .role = TensorRole::kPerRow,
     .dtype = DTypeRule::kFloat,
     .layout = "[B, H, T, S or K]",
     .block_layout = "[H, num_rows, S or K]",
     .per_head = true,
     .input = &IndexerKlInputs::attention_logits,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_attention_logits(); }},
    {.name = "attention_weights",
     .role = TensorRole::kPerRow,
     .dtype = DTypeRule::kFloat,
     .layout = "[B, T, S or K]",
     .block_layout = "[num_rows, S or K]",
     .per_head = false,
     .input = &IndexerKlInputs::attention_weights,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_attention_weights(); }},
    {.name = "indexer_scores",
     .role = TensorRole::kPerRow,
     .dtype = DTypeRule::kFloat,
     .layout = "[B, T, S or K]",
     .block_layout = "[num_rows, S or K]",
     .per_head = false,
     .input = &IndexerKlInputs::indexer_scores,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_indexer_scores(); }},
    {.name = "topk_indices",
     .role = TensorRole::kPerRow,
     .dtype = DTypeRule::kInt32,
     .layout = "[B, T, K]",
     .block_layout = "[num_rows, K]",
     .per_head = false,
     .input = &IndexerKlInputs::topk_indices,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_topk_indices(); }},
    {.name = "attention_mask",
     .role = TensorRole::kPerRow,
     .dtype = DTypeRule::kBool,
     .layout = "[B, T, S]",
     .block_layout = "[num_rows, S]",
     .per_head = false,
     .input = &IndexerKlInputs::attention_mask,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_attention_mask(); }},
    {.name = "segment_ids_q",
     .role = TensorRole::kSmall,
     .dtype = DTypeRule::kInt32,
     .layout = "[B, T]",
     .block_layout = "",
     .per_head = false,
     .input = &IndexerKlInputs::segment_ids_q,
     .mutable_block_bytes = nullptr},
    {.name = "segment_ids_kv",
     .role = TensorRole::kSmall,
     .dtype = DTypeRule::kInt32,
     .layout = "[B, S]",
     .block_layout = "",
     .per_head = false,
     .input = &IndexerKlInputs::segment_ids_kv,
     .mutable_block_bytes = nullptr},
    {.name = "key_padding_mask",
     .role = TensorRole::kSmall,
     .dtype = DTypeRule::kBool,
     .layout = "[B, S]",
     .block_layout = "",
     .per_head = false,
     .input = &IndexerKlInputs::key_padding_mask,
     .mutable_block_bytes = nullptr},
    {.name = "row_valid",
     .role = TensorRole::kSmall,
     .dtype = DTypeRule::kBool,
     .layout = "[B, T]",
     .block_layout = "",
     .per_head = false,
     .input = &IndexerKlInputs::row_valid,
     .mutable_block_bytes = nullptr},
};

// The per-row entries of kRequestTensors, in its order. (Not a
// std::views::filter: clang 14, which builds the fuzzer, cannot compile
// libstdc++ 12's ranges.)
absl::Span<const std::reference_wrapper<const RequestTensor>> PerRowTensors();

// The entry named `name`, or null.
const RequestTensor* FindRequestTensor(absl::string_view name);

// "FP32, BF16 or FP16", "INT32" or "BOOL".
absl::string_view DTypeRuleText(DTypeRule rule);

bool IsRequired(const RequestTensor& tensor);

// The accessors below take entries of kRequestTensors (they look the fields
// up by the entry's place in it), and find the message fields by name.

// The tensor in `request`, or null when the request does not carry it.
const v1::Tensor* FindTensor(const v1::ComputeLossRequest& request,
                             const RequestTensor& tensor);
v1::Tensor* MutableTensor(v1::ComputeLossRequest& request,
                          const RequestTensor& tensor);

// A small tensor in `header`, or null when absent.
const v1::Tensor* FindTensor(const v1::StreamHeader& header,
                             const RequestTensor& tensor);
v1::Tensor* MutableTensor(v1::StreamHeader& header,
                          const RequestTensor& tensor);

// A per-row tensor's spec in `header`, or null when absent.
const v1::TensorSpec* FindSpec(const v1::StreamHeader& header,
                               const RequestTensor& tensor);
v1::TensorSpec* MutableSpec(v1::StreamHeader& header,
                            const RequestTensor& tensor);

// A per-row tensor's bytes in `block` (empty when absent).
const std::string& BlockBytes(const v1::RowBlock& block,
                              const RequestTensor& tensor);

// The tensor's view in `inputs`, or null when absent.
const TensorView* FindInput(const IndexerKlInputs& inputs,
                            const RequestTensor& tensor);
void SetInput(const RequestTensor& tensor, TensorView view,
              IndexerKlInputs& inputs);

}  // namespace klserve

#endif  // KLSERVE_PROTO_REQUEST_TENSORS_H_
