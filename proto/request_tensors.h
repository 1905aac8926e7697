#ifndef KLSERVE_PROTO_REQUEST_TENSORS_H_
#define KLSERVE_PROTO_REQUEST_TENSORS_H_

// The request's tensors, named once. Whatever handles them one by one (the
// server's codec, its size limits and stream reactor, the client's stream
// slicer, klctl, the tests' harness) iterates kRequestTensors, so a tensor
// cannot be left out of one of them. Adding a tensor is one entry here, its
// field in proto/klserve/v1/klserve.proto (ComputeLossRequest, StreamHeader
// and, when per-row, RowBlock), its member of IndexerKlInputs or
// ProjectionsInputs (or both: the masks) and its use in the kernels (for a
// per-row tensor also its slot in RowBlockBytes, filled by
// server/codec/tensor_codec.cc's BlockBytesOf, or in ProjectionsBlockBytes
// with its entry in kernels' ProjectionsRowTensors, which names it), and its
// flag in client/klctl.cc (a flag is a macro, so it is written out; klctl
// refuses a loss call while one is missing). tests/proto/request_tensors_test.cc
// fails until the table and the proto agree.
//
// A request is in one of two forms: the logits forms (the target and the
// indexer scores given, IndexerKlInputs) or the projections form (`query`
// given, ProjectionsInputs). Each entry names its member in each form that
// takes it; a tensor the request's form does not take is an error.
//
// Shared by the server and the client libraries; needs no kernels code (the
// inputs structs are named only through member pointers).

#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/input_dtypes.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"
#include "kernels/tensor_view.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve {

enum class TensorRole {
  // As large as the problem, one slice per row (b, t): streamed in the
  // RowBlocks (the StreamHeader holds its TensorSpec), and each block's
  // bytes are held to the tensor limit. In either form (the projections
  // form's query side too).
  kPerRow,
  // Per batch entry ([B, T] or [B, S]): sent whole, in the StreamHeader too.
  kSmall,
  // The projections form's key side ([B, S, ...]): every query row reads
  // all of it, so it is sent whole, in the StreamHeader too, where the
  // server holds it for the stream's life (--max_stream_key_bytes).
  kKeySide,
};

// The two forms of a request.
enum class RequestForm {
  kLogits,       // attention_logits or attention_weights, indexer_scores
  kProjections,  // query, key, index_query, index_key, index_weights
};

// A tensor's member of one form's inputs struct: none (the form does not
// take the tensor), optional, or a plain view for a tensor every request of
// that form must carry.
template <typename Inputs>
using InputMember =
    std::variant<std::monostate, std::optional<TensorView> Inputs::*,
                 TensorView Inputs::*>;

struct RequestTensor {
  // The field's name in ComputeLossRequest (a Tensor), StreamHeader (a
  // TensorSpec when per-row, else a Tensor) and, when per-row, RowBlock
  // (bytes). The accessors below find the
  // fields by this name.
  absl::string_view name;
  TensorRole role;
  DTypeRule dtype;  // its rule in kernels/input_dtypes.h
  // Letters as in klserve.proto: B batch, H heads, T query rows, S keys,
  // K top-k slots; in the projections form D the head dimension, H_kv the
  // key heads, H_I and D_I the indexer's heads and their dimension.
  absl::string_view layout;
  // Per-row: the layout of a RowBlock's bytes of num_rows rows; else empty.
  absl::string_view block_layout;
  // Per-row with a head axis before T: [B, H, T, X...], blocks head-major
  // [H, n, X...]. Otherwise T is the second axis: [B, T, X...], blocks
  // [n, X...].
  bool per_head;
  // Its member in each form.
  InputMember<IndexerKlInputs> logits;
  InputMember<ProjectionsInputs> projections;
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
     .dtype = input_dtype::kScores,
     .layout = "[B, H, T, S or K]",
     .block_layout = "[H, num_rows, S or K]",
     .per_head = true,
     .logits = &IndexerKlInputs::attention_logits,
     .projections = {},
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_attention_logits(); }},
    {.name = "attention_weights",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kScores,
     .layout = "[B, T, S or K]",
     .block_layout = "[num_rows, S or K]",
     .per_head = false,
     .logits = &IndexerKlInputs::attention_weights,
     .projections = {},
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_attention_weights(); }},
    {.name = "indexer_scores",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kScores,
     .layout = "[B, T, S or K]",
     .block_layout = "[num_rows, S or K]",
     .per_head = false,
     .logits = &IndexerKlInputs::indexer_scores,
     .projections = {},
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_indexer_scores(); }},
    {.name = "topk_indices",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kIndex,
     .layout = "[B, T, K]",
     .block_layout = "[num_rows, K]",
     .per_head = false,
     .logits = &IndexerKlInputs::topk_indices,
     .projections = &ProjectionsInputs::topk_indices,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_topk_indices(); }},
    {.name = "attention_mask",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kMask,
     .layout = "[B, T, S]",
     .block_layout = "[num_rows, S]",
     .per_head = false,
     .logits = &IndexerKlInputs::attention_mask,
     .projections = &ProjectionsInputs::attention_mask,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_attention_mask(); }},
    {.name = "segment_ids_q",
     .role = TensorRole::kSmall,
     .dtype = input_dtype::kIndex,
     .layout = "[B, T]",
     .block_layout = "",
     .per_head = false,
     .logits = &IndexerKlInputs::segment_ids_q,
     .projections = &ProjectionsInputs::segment_ids_q,
     .mutable_block_bytes = nullptr},
    {.name = "segment_ids_kv",
     .role = TensorRole::kSmall,
     .dtype = input_dtype::kIndex,
     .layout = "[B, S]",
     .block_layout = "",
     .per_head = false,
     .logits = &IndexerKlInputs::segment_ids_kv,
     .projections = &ProjectionsInputs::segment_ids_kv,
     .mutable_block_bytes = nullptr},
    {.name = "key_padding_mask",
     .role = TensorRole::kSmall,
     .dtype = input_dtype::kMask,
     .layout = "[B, S]",
     .block_layout = "",
     .per_head = false,
     .logits = &IndexerKlInputs::key_padding_mask,
     .projections = &ProjectionsInputs::key_padding_mask,
     .mutable_block_bytes = nullptr},
    {.name = "row_valid",
     .role = TensorRole::kSmall,
     .dtype = input_dtype::kMask,
     .layout = "[B, T]",
     .block_layout = "",
     .per_head = false,
     .logits = &IndexerKlInputs::row_valid,
     .projections = &ProjectionsInputs::row_valid,
     .mutable_block_bytes = nullptr},
    {.name = "key_start",
     .role = TensorRole::kSmall,
     .dtype = input_dtype::kIndex,
     .layout = "[B, T]",
     .block_layout = "",
     .per_head = false,
     .logits = &IndexerKlInputs::key_start,
     .projections = &ProjectionsInputs::key_start,
     .mutable_block_bytes = nullptr},
    {.name = "key_end",
     .role = TensorRole::kSmall,
     .dtype = input_dtype::kIndex,
     .layout = "[B, T]",
     .block_layout = "",
     .per_head = false,
     .logits = &IndexerKlInputs::key_end,
     .projections = &ProjectionsInputs::key_end,
     .mutable_block_bytes = nullptr},
    {.name = "query",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kProjection,
     .layout = "[B, T, H, D]",
     .block_layout = "[num_rows, H, D]",
     .per_head = false,
     .logits = {},
     .projections = &ProjectionsInputs::query,
     .mutable_block_bytes = [](v1::RowBlock& b) { return b.mutable_query(); }},
    {.name = "key",
     .role = TensorRole::kKeySide,
     .dtype = input_dtype::kProjection,
     .layout = "[B, S, H_kv, D]",
     .block_layout = "",
     .per_head = false,
     .logits = {},
     .projections = &ProjectionsInputs::key,
     .mutable_block_bytes = nullptr},
    {.name = "lse",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kLse,
     .layout = "[B, H, T]",
     .block_layout = "[H, num_rows]",
     .per_head = true,
     .logits = {},
     .projections = &ProjectionsInputs::lse,
     .mutable_block_bytes = [](v1::RowBlock& b) { return b.mutable_lse(); }},
    {.name = "index_query",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kProjection,
     .layout = "[B, T, H_I, D_I]",
     .block_layout = "[num_rows, H_I, D_I]",
     .per_head = false,
     .logits = {},
     .projections = &ProjectionsInputs::index_query,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_index_query(); }},
    {.name = "index_key",
     .role = TensorRole::kKeySide,
     .dtype = input_dtype::kProjection,
     .layout = "[B, S, D_I]",
     .block_layout = "",
     .per_head = false,
     .logits = {},
     .projections = &ProjectionsInputs::index_key,
     .mutable_block_bytes = nullptr},
    {.name = "index_weights",
     .role = TensorRole::kPerRow,
     .dtype = input_dtype::kProjection,
     .layout = "[B, T, H_I]",
     .block_layout = "[num_rows, H_I]",
     .per_head = false,
     .logits = {},
     .projections = &ProjectionsInputs::index_weights,
     .mutable_block_bytes =
         [](v1::RowBlock& b) { return b.mutable_index_weights(); }},
};

// The per-row entries of kRequestTensors, in its order. (Not a
// std::views::filter: clang 14, which builds the fuzzer, cannot compile
// libstdc++ 12's ranges.)
absl::Span<const std::reference_wrapper<const RequestTensor>> PerRowTensors();

// The entry named `name`, or null.
const RequestTensor* FindRequestTensor(absl::string_view name);

// "FP32, BF16 or FP16", "FP32", "INT32" or "BOOL".
std::string DTypeRuleText(DTypeRule rule);

// The form of `request`: the projections form when it carries `query` (in
// a StreamHeader, its spec).
RequestForm FormOf(const v1::ComputeLossRequest& request);
RequestForm FormOf(const v1::StreamHeader& header);

// Whether requests of `form` take `tensor`, and must carry it.
bool TakenIn(RequestForm form, const RequestTensor& tensor);
bool RequiredIn(RequestForm form, const RequestTensor& tensor);

// The accessors below take entries of kRequestTensors (they look the fields
// up by the entry's place in it), and find the message fields by name.

// The tensor in `request`, or null when the request does not carry it.
const v1::Tensor* FindTensor(const v1::ComputeLossRequest& request,
                             const RequestTensor& tensor);
v1::Tensor* MutableTensor(v1::ComputeLossRequest& request,
                          const RequestTensor& tensor);

// A small or key-side tensor in `header`, or null when absent.
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

// The tensor's view in `inputs`, or null when absent or not of that form.
const TensorView* FindInput(const IndexerKlInputs& inputs,
                            const RequestTensor& tensor);
const TensorView* FindInput(const ProjectionsInputs& inputs,
                            const RequestTensor& tensor);
// Sets the tensor's member; the inputs' form must take it (TakenIn).
void SetInput(const RequestTensor& tensor, TensorView view,
              IndexerKlInputs& inputs);
void SetInput(const RequestTensor& tensor, TensorView view,
              ProjectionsInputs& inputs);

}  // namespace klserve

#endif  // KLSERVE_PROTO_REQUEST_TENSORS_H_
