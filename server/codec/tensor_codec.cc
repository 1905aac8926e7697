#include "server/codec/tensor_codec.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "server/codec/grpc_status.h"

namespace klserve::server {
namespace {

constexpr DType kWireDTypes[] = {DType::kFloat32, DType::kBFloat16,
                                 DType::kFloat16, DType::kInt32, DType::kBool};

// Sets `slot` to a view of `tensor` when the message carries it.
absl::Status MaybeView(absl::string_view field, bool present,
                       const v1::Tensor& tensor,
                       std::optional<TensorView>& slot) {
  if (!present) return absl::OkStatus();
  ASSIGN_OR_RETURN(slot, ViewOf(field, tensor));
  return absl::OkStatus();
}

// A shape-only view for a tensor whose bytes come in blocks.
absl::StatusOr<TensorView> SpecView(absl::string_view field,
                                    const v1::TensorSpec& spec) {
  TensorView view;
  ASSIGN_OR_RETURN(view.dtype,
                   ParseDType(absl::StrCat(field, ".dtype"), spec.dtype()));
  view.shape.assign(spec.shape().begin(), spec.shape().end());
  return view;
}

absl::Status MaybeSpec(absl::string_view field, bool present,
                       const v1::TensorSpec& spec,
                       std::optional<TensorView>& slot) {
  if (!present) return absl::OkStatus();
  ASSIGN_OR_RETURN(slot, SpecView(field, spec));
  return absl::OkStatus();
}

// The small tensors, which travel whole in both forms of request.
template <typename Message>
absl::Status SmallTensors(const Message& m, IndexerKlInputs& in) {
  RETURN_IF_ERROR(MaybeView("segment_ids_q", m.has_segment_ids_q(),
                            m.segment_ids_q(), in.segment_ids_q));
  RETURN_IF_ERROR(MaybeView("segment_ids_kv", m.has_segment_ids_kv(),
                            m.segment_ids_kv(), in.segment_ids_kv));
  RETURN_IF_ERROR(MaybeView("key_padding_mask", m.has_key_padding_mask(),
                            m.key_padding_mask(), in.key_padding_mask));
  return MaybeView("row_valid", m.has_row_valid(), m.row_valid(), in.row_valid);
}

}  // namespace

absl::StatusOr<DType> ParseDType(absl::string_view field,
                                 absl::string_view name) {
  for (DType dtype : kWireDTypes) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be one of FP32, BF16, FP16, INT32, BOOL, got ",
      QuoteForMessage(name)));
}

absl::StatusOr<TensorView> ViewOf(absl::string_view field,
                                  const v1::Tensor& tensor) {
  TensorView view;
  ASSIGN_OR_RETURN(view.dtype,
                   ParseDType(absl::StrCat(field, ".dtype"), tensor.dtype()));
  view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  view.data = tensor.data().data();
  view.byte_size = static_cast<int64_t>(tensor.data().size());
  return view;
}

absl::StatusOr<IndexerKlOptions> OptionsFrom(const v1::LossOptions& o) {
  IndexerKlOptions options;
  options.causal = o.causal();
  if (o.has_q_offset()) options.q_offset = o.q_offset();
  options.num_keys = o.num_keys();
  if (o.has_softmax_scale()) options.softmax_scale = o.softmax_scale();
  switch (o.flavor()) {
    case v1::FLAVOR_UNSPECIFIED:
    case v1::FLAVOR_EXACT:
      options.flavor = Flavor::kExact;
      break;
    case v1::FLAVOR_MAXTEXT:
      options.flavor = Flavor::kMaxText;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("options.flavor: unknown value ", o.flavor()));
  }
  switch (o.reduction()) {
    case v1::REDUCTION_UNSPECIFIED:
    case v1::REDUCTION_MEAN:
      options.reduction = Reduction::kMean;
      break;
    case v1::REDUCTION_MEAN_VALID:
      options.reduction = Reduction::kMeanValid;
      break;
    case v1::REDUCTION_SUM:
      options.reduction = Reduction::kSum;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("options.reduction: unknown value ", o.reduction()));
  }
  if (o.has_scaling_factor()) options.scaling_factor = o.scaling_factor();
  options.want_grad = !o.skip_grad();
  if (!o.grad_dtype().empty()) {
    ASSIGN_OR_RETURN(options.grad_dtype,
                     ParseDType("grad_dtype", o.grad_dtype()));
  }
  options.want_row_kl = o.want_row_kl();
  options.want_diagnostics = o.want_diagnostics();
  options.recall_k = o.recall_k();
  return options;
}

absl::StatusOr<IndexerKlInputs> InputsFrom(const v1::ComputeLossRequest& r) {
  IndexerKlInputs in;
  RETURN_IF_ERROR(MaybeView("attention_logits", r.has_attention_logits(),
                            r.attention_logits(), in.attention_logits));
  RETURN_IF_ERROR(MaybeView("attention_weights", r.has_attention_weights(),
                            r.attention_weights(), in.attention_weights));
  if (!r.has_indexer_scores()) {
    return absl::InvalidArgumentError("indexer_scores: required, got none");
  }
  ASSIGN_OR_RETURN(in.indexer_scores,
                   ViewOf("indexer_scores", r.indexer_scores()));
  RETURN_IF_ERROR(MaybeView("topk_indices", r.has_topk_indices(),
                            r.topk_indices(), in.topk_indices));
  RETURN_IF_ERROR(MaybeView("attention_mask", r.has_attention_mask(),
                            r.attention_mask(), in.attention_mask));
  RETURN_IF_ERROR(SmallTensors(r, in));
  return in;
}

absl::StatusOr<IndexerKlInputs> InputsFrom(const v1::StreamHeader& h) {
  IndexerKlInputs in;
  RETURN_IF_ERROR(MaybeSpec("attention_logits", h.has_attention_logits(),
                            h.attention_logits(), in.attention_logits));
  RETURN_IF_ERROR(MaybeSpec("attention_weights", h.has_attention_weights(),
                            h.attention_weights(), in.attention_weights));
  if (!h.has_indexer_scores()) {
    return absl::InvalidArgumentError("indexer_scores: required, got none");
  }
  ASSIGN_OR_RETURN(in.indexer_scores,
                   SpecView("indexer_scores", h.indexer_scores()));
  RETURN_IF_ERROR(MaybeSpec("topk_indices", h.has_topk_indices(),
                            h.topk_indices(), in.topk_indices));
  RETURN_IF_ERROR(MaybeSpec("attention_mask", h.has_attention_mask(),
                            h.attention_mask(), in.attention_mask));
  RETURN_IF_ERROR(SmallTensors(h, in));
  return in;
}

RowBlockBytes BlockBytesOf(const v1::RowBlock& block) {
  const auto bytes = [](const std::string& s) {
    return std::pair<const void*, int64_t>(s.data(),
                                           static_cast<int64_t>(s.size()));
  };
  RowBlockBytes out;
  const std::string& target = !block.attention_logits().empty()
                                  ? block.attention_logits()
                                  : block.attention_weights();
  std::tie(out.target, out.target_bytes) = bytes(target);
  std::tie(out.scores, out.scores_bytes) = bytes(block.indexer_scores());
  std::tie(out.indices, out.indices_bytes) = bytes(block.topk_indices());
  std::tie(out.mask, out.mask_bytes) = bytes(block.attention_mask());
  return out;
}

void ResultTo(const IndexerKlResult& result, v1::LossResult* out) {
  out->set_loss(result.loss);
  out->set_unscaled_loss(result.unscaled_loss);
  out->set_denominator(result.denominator);
  out->set_rows_counted(result.rows_counted);
  out->set_rows_fully_masked(result.rows_fully_masked);
  out->set_rows_zero_target(result.rows_zero_target);
  if (result.diagnostics) {
    v1::Diagnostics* d = out->mutable_diagnostics();
    d->set_mean_entropy_p(result.diagnostics->mean_entropy_p);
    d->set_mean_entropy_q(result.diagnostics->mean_entropy_q);
    if (result.diagnostics->topk_recall) {
      d->set_topk_recall(*result.diagnostics->topk_recall);
    }
  }
}

void WidestResultTo(v1::LossResult* out) {
  // Doubles encode to a fixed 8 bytes; an int64 varint is longest (10
  // bytes) for a negative value.
  constexpr int64_t kWidestInt = std::numeric_limits<int64_t>::min();
  IndexerKlResult widest;
  widest.loss = widest.unscaled_loss = 1;
  widest.denominator = widest.rows_counted = widest.rows_fully_masked =
      widest.rows_zero_target = kWidestInt;
  widest.diagnostics.emplace();
  widest.diagnostics->mean_entropy_p = widest.diagnostics->mean_entropy_q = 1;
  widest.diagnostics->topk_recall = 1;
  ResultTo(widest, out);
}

namespace {

std::byte* AllocateBytes(absl::string_view dtype_name, int64_t element_size,
                         std::initializer_list<int64_t> shape,
                         v1::Tensor* out) {
  out->set_dtype(std::string(dtype_name));
  int64_t count = 1;
  for (int64_t d : shape) {
    out->add_shape(d);
    count *= d;
  }
  std::string* data = out->mutable_data();
  data->resize(count * element_size);
  return reinterpret_cast<std::byte*>(data->data());
}

}  // namespace

std::byte* AllocateTensor(DType dtype, std::initializer_list<int64_t> shape,
                          v1::Tensor* out) {
  return AllocateBytes(DTypeName(dtype), DTypeSize(dtype), shape, out);
}

double* AllocateFloat64Tensor(std::initializer_list<int64_t> shape,
                              v1::Tensor* out) {
  // std::string's buffer is aligned for double (heap: 16 bytes; in-object
  // storage: 8).
  return reinterpret_cast<double*>(
      AllocateBytes("FP64", sizeof(double), shape, out));
}

}  // namespace klserve::server
