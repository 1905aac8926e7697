#include "server/codec/tensor_codec.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"
#include "kernels/tensor_checks.h"
#include "proto/request_tensors.h"
#include "server/codec/grpc_status.h"

namespace klserve::server {
namespace {

// `name` as one of `allowed`; INVALID_ARGUMENT naming `field` and them.
absl::StatusOr<DType> ParseDTypeOf(absl::string_view field,
                                   absl::string_view name,
                                   absl::Span<const DType> allowed) {
  for (DType dtype : allowed) {
    if (name == DTypeName(dtype)) return dtype;
  }
  std::vector<std::string> names;
  for (DType dtype : allowed) names.emplace_back(DTypeName(dtype));
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be one of ", absl::StrJoin(names, ", "),
                   ", got ", QuoteForMessage(name)));
}

// "FP32", "BF16", "FP16", "INT32" or "BOOL". INVALID_ARGUMENT names `field`.
absl::StatusOr<DType> ParseDType(absl::string_view field,
                                 absl::string_view name) {
  return ParseDTypeOf(field, name, kWireDTypes);
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

// A view of `tensor`, or nullopt for a tensor the message lacks (null).
absl::StatusOr<std::optional<TensorView>> MaybeViewOf(absl::string_view field,
                                                      const v1::Tensor* tensor,
                                                      CallRegions* regions) {
  if (tensor == nullptr) return std::nullopt;
  return ViewOf(field, *tensor, regions);
}

absl::StatusOr<std::optional<TensorView>> ViewIn(
    const v1::ComputeLossRequest& request, const RequestTensor& tensor,
    CallRegions* regions) {
  return MaybeViewOf(tensor.name, FindTensor(request, tensor), regions);
}

// In a StreamHeader: a per-row tensor's spec (dtype and shape only) or a
// small or key-side tensor whole.
// A stream carries its bytes: no regions.
absl::StatusOr<std::optional<TensorView>> ViewIn(const v1::StreamHeader& header,
                                                 const RequestTensor& tensor,
                                                 CallRegions* /*regions*/) {
  if (tensor.role != TensorRole::kPerRow) {
    return MaybeViewOf(tensor.name, FindTensor(header, tensor), nullptr);
  }
  const v1::TensorSpec* spec = FindSpec(header, tensor);
  if (spec == nullptr) return std::nullopt;
  return SpecView(tensor.name, *spec);
}

// Whether `message` carries the per-row tensor: whole in a request, as its
// spec in a stream header.
bool HasSpecOrTensor(const v1::ComputeLossRequest& request,
                     const RequestTensor& tensor) {
  return FindTensor(request, tensor) != nullptr;
}
bool HasSpecOrTensor(const v1::StreamHeader& header,
                     const RequestTensor& tensor) {
  return FindSpec(header, tensor) != nullptr;
}

// INVALID_ARGUMENT naming the first tensor `message` carries that requests
// of `form` do not take: a request is in one form or the other, never both.
template <typename Message>
absl::Status CheckForm(const Message& message, RequestForm form) {
  for (const RequestTensor& tensor : kRequestTensors) {
    const bool present = tensor.role == TensorRole::kPerRow
                             ? HasSpecOrTensor(message, tensor)
                             : FindTensor(message, tensor) != nullptr;
    if (!present || TakenIn(form, tensor)) continue;
    return absl::InvalidArgumentError(
        form == RequestForm::kProjections
            ? absl::StrCat(tensor.name,
                           ": not in the projections form (query is set), "
                           "got a tensor")
            : absl::StrCat(tensor.name,
                           ": only in the projections form (a request "
                           "with query), got it without query"));
  }
  return absl::OkStatus();
}

// The inputs of `form` that `message` carries, each tensor viewed as ViewIn
// gives it.
template <typename Inputs, typename Message>
absl::StatusOr<Inputs> InputsIn(const Message& message, RequestForm form,
                                CallRegions* regions) {
  RETURN_IF_ERROR(CheckForm(message, form));
  Inputs in;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (!TakenIn(form, tensor)) continue;
    ASSIGN_OR_RETURN(std::optional<TensorView> view,
                     ViewIn(message, tensor, regions));
    if (view.has_value()) {
      SetInput(tensor, *std::move(view), in);
    } else if (RequiredIn(form, tensor)) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor.name, ": required, got none"));
    }
  }
  return in;
}

// INVALID_ARGUMENT naming the first option of the projections form that `o`
// sets, for a request in the logits form.
absl::Status CheckNoProjectionsOptions(const v1::LossOptions& o) {
  const auto refuse = [](absl::string_view option, const auto& value) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.", option, ": only in the projections form (with query), got ",
        value));
  };
  if (o.has_index_weight_scale()) {
    return refuse("index_weight_scale", o.index_weight_scale());
  }
  if (o.has_use_relu())
    return refuse("use_relu", o.use_relu() ? "true" : "false");
  if (o.topk() != 0) return refuse("topk", o.topk());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TensorView> ViewOf(absl::string_view field,
                                  const v1::Tensor& tensor,
                                  CallRegions* regions) {
  TensorView view;
  ASSIGN_OR_RETURN(view.dtype,
                   ParseDType(absl::StrCat(field, ".dtype"), tensor.dtype()));
  view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  if (!tensor.has_region()) {
    view.data = tensor.data().data();
    view.byte_size = static_cast<int64_t>(tensor.data().size());
    return view;
  }
  if (!tensor.data().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": both data and region are set; send one of them"));
  }
  if (regions == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".region: regions are for ComputeLoss; a stream carries its ",
        "tensors' bytes"));
  }
  const std::string slice_field = absl::StrCat(field, ".region");
  ASSIGN_OR_RETURN(
      const std::byte* data,
      regions->Input(slice_field, tensor.region(), DTypeSize(view.dtype)));
  // Exactly the shape's bytes, before anything is copied.
  const std::optional<int64_t> bytes =
      ShapeBytes(DTypeSize(view.dtype), view.shape);
  if (!bytes.has_value() ||
      absl::c_any_of(view.shape, [](int64_t d) { return d < 1; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape: every dimension >= 1 and the bytes within int64, ",
        "got ", ShapeString(view.shape)));
  }
  view.byte_size = tensor.region().byte_size();
  if (view.byte_size != *bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        slice_field, ".byte_size: must be ", *bytes, " (", tensor.dtype(), " ",
        ShapeString(view.shape), "), got ", view.byte_size));
  }
  // Indices, bounds, segments and masks steer what the kernels index: a
  // client changing them after they are checked could send a read out of
  // bounds. They are small beside the float tensors, so they are copied.
  const bool steers = view.dtype == DType::kInt32 || view.dtype == DType::kBool;
  if (steers) {
    ASSIGN_OR_RETURN(view.data, regions->Copy(field, data, view.byte_size));
  } else {
    view.data = data;
  }
  return view;
}

namespace {

// The options every form shares.
absl::StatusOr<IndexerKlOptions> LossOptionsFrom(const v1::LossOptions& o) {
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
  if (o.has_grad_scale()) options.grad_scale = o.grad_scale();
  options.want_grad = !o.skip_grad();
  if (!o.grad_dtype().empty()) {
    ASSIGN_OR_RETURN(options.grad_dtype,
                     ParseDTypeOf("grad_dtype", o.grad_dtype(), kFloatDTypes));
  }
  options.want_row_kl = o.want_row_kl();
  options.want_diagnostics = o.want_diagnostics();
  options.recall_k = o.recall_k();
  return options;
}

}  // namespace

absl::StatusOr<IndexerKlOptions> OptionsFrom(const v1::LossOptions& o) {
  RETURN_IF_ERROR(CheckNoProjectionsOptions(o));
  return LossOptionsFrom(o);
}

absl::StatusOr<ProjectionsOptions> ProjectionsOptionsFrom(
    const v1::LossOptions& o) {
  ProjectionsOptions options;
  ASSIGN_OR_RETURN(options.loss, LossOptionsFrom(o));
  if (o.has_index_weight_scale()) {
    options.index_weight_scale = o.index_weight_scale();
  }
  if (o.has_use_relu()) options.use_relu = o.use_relu();
  options.topk = o.topk();
  return options;
}

absl::StatusOr<IndexerKlInputs> InputsFrom(
    const v1::ComputeLossRequest& request, CallRegions& regions) {
  return InputsIn<IndexerKlInputs>(request, RequestForm::kLogits, &regions);
}

absl::StatusOr<ProjectionsInputs> ProjectionsInputsFrom(
    const v1::ComputeLossRequest& request, CallRegions& regions) {
  return InputsIn<ProjectionsInputs>(request, RequestForm::kProjections,
                                     &regions);
}

absl::StatusOr<IndexerKlInputs> InputsFrom(const v1::StreamHeader& header) {
  return InputsIn<IndexerKlInputs>(header, RequestForm::kLogits, nullptr);
}

absl::StatusOr<ProjectionsInputs> ProjectionsInputsFrom(
    const v1::StreamHeader& header) {
  return InputsIn<ProjectionsInputs>(header, RequestForm::kProjections,
                                     nullptr);
}

ProjectionsBlockBytes ProjectionsBlockBytesOf(const ProjectionsProblem& problem,
                                              const v1::RowBlock& block) {
  ProjectionsBlockBytes out;
  // Every tensor's, those the problem has not too (which must be empty).
  for (const ProjectionsRowTensor& tensor : ProjectionsRowTensors(problem)) {
    const std::string& bytes =
        BlockBytes(block, *FindRequestTensor(tensor.field));
    out.*tensor.block_data = bytes.data();
    out.*tensor.block_bytes = static_cast<int64_t>(bytes.size());
  }
  return out;
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

std::byte* AllocateTensor(absl::string_view dtype_name, int64_t element_size,
                          absl::Span<const int64_t> shape, v1::Tensor* out) {
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

std::byte* AllocateTensor(DType dtype, absl::Span<const int64_t> shape,
                          v1::Tensor* out) {
  return AllocateTensor(DTypeName(dtype), DTypeSize(dtype), shape, out);
}

double* AllocateFloat64Tensor(absl::Span<const int64_t> shape,
                              v1::Tensor* out) {
  // std::string's buffer is aligned for double (heap: 16 bytes; in-object
  // storage: 8).
  return reinterpret_cast<double*>(
      AllocateTensor("FP64", sizeof(double), shape, out));
}

namespace {

// Each output's fields, in the request's OutputRegions and in the response.
struct OutputFields {
  absl::string_view name;
  bool (v1::OutputRegions::*has_slice)() const;
  const v1::RegionSlice& (v1::OutputRegions::*slice)() const;
  bool (v1::ComputeLossResponse::*has_tensor)() const;
  v1::Tensor* (v1::ComputeLossResponse::*mutable_tensor)();
};

#define KLSERVE_OUTPUT(field)                                           \
  OutputFields {                                                        \
#field, &v1::OutputRegions::has_##field, &v1::OutputRegions::field, \
        &v1::ComputeLossResponse::has_##field,                          \
        &v1::ComputeLossResponse::mutable_##field                       \
  }
const OutputFields kOutputFields[] = {
    KLSERVE_OUTPUT(grad),
    KLSERVE_OUTPUT(row_kl),
    KLSERVE_OUTPUT(d_index_query),
    KLSERVE_OUTPUT(d_index_key),
    KLSERVE_OUTPUT(d_index_weights),
    KLSERVE_OUTPUT(topk_indices),
};
#undef KLSERVE_OUTPUT

}  // namespace

absl::StatusOr<std::byte*> PlaceOutput(
    absl::string_view field, absl::string_view dtype_name, int64_t element_size,
    absl::Span<const int64_t> shape, const v1::ComputeLossRequest& request,
    CallRegions& regions, v1::ComputeLossResponse& response) {
  const OutputFields* fields = absl::c_find_if(
      kOutputFields, [&](const OutputFields& f) { return f.name == field; });
  if (fields == std::end(kOutputFields)) {
    return absl::InternalError(
        absl::StrCat(field, ": not an output a request may place"));
  }
  v1::Tensor* out = (response.*fields->mutable_tensor)();
  if (!(request.outputs().*fields->has_slice)()) {
    return AllocateTensor(dtype_name, element_size, shape, out);
  }
  const v1::RegionSlice& slice = (request.outputs().*fields->slice)();
  // Within 64 bits: CheckOutputsFit has weighed every output.
  int64_t bytes = element_size;
  for (int64_t d : shape) bytes *= d;
  const std::string name = absl::StrCat("outputs.", field);
  if (slice.byte_size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".byte_size: must be ", bytes, " (", field, " is ", dtype_name,
        " ", absl::StrJoin(shape, "x"), "), got ", slice.byte_size()));
  }
  ASSIGN_OR_RETURN(std::byte * data, regions.Output(name, slice, element_size));
  out->set_dtype(std::string(dtype_name));
  for (int64_t d : shape) out->add_shape(d);
  *out->mutable_region() = slice;
  return data;
}

absl::StatusOr<std::byte*> PlaceOutput(absl::string_view field, DType dtype,
                                       absl::Span<const int64_t> shape,
                                       const v1::ComputeLossRequest& request,
                                       CallRegions& regions,
                                       v1::ComputeLossResponse& response) {
  return PlaceOutput(field, DTypeName(dtype), DTypeSize(dtype), shape, request,
                     regions, response);
}

absl::StatusOr<double*> PlaceRowKl(absl::Span<const int64_t> shape,
                                   const v1::ComputeLossRequest& request,
                                   CallRegions& regions,
                                   v1::ComputeLossResponse& response) {
  ASSIGN_OR_RETURN(std::byte * data,
                   PlaceOutput("row_kl", "FP64", sizeof(double), shape, request,
                               regions, response));
  return reinterpret_cast<double*>(data);
}

absl::Status CheckOutputsProduced(const v1::ComputeLossRequest& request,
                                  const v1::ComputeLossResponse& response) {
  for (const OutputFields& fields : kOutputFields) {
    if ((request.outputs().*fields.has_slice)() &&
        !(response.*fields.has_tensor)()) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs.", fields.name, ": this request produces no ",
                       fields.name, " (see its options and form)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace klserve::server
