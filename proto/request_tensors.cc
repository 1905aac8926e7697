#include "proto/request_tensors.h"

#include <array>
#include <cstddef>
#include <iterator>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace klserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Where one entry lives in each message (null where it has no field, e.g. a
// small tensor in RowBlock). Looked up once: the accessors run per block.
struct Fields {
  const FieldDescriptor* request = nullptr;
  const FieldDescriptor* header = nullptr;
  const FieldDescriptor* block = nullptr;
};

const Fields& FieldsOf(const RequestTensor& tensor) {
  static const auto* const fields = [] {
    auto* out = new std::array<Fields, std::size(kRequestTensors)>;
    const auto find = [](const Descriptor* message, const RequestTensor& t) {
      return message->FindFieldByName(std::string(t.name));
    };
    for (size_t i = 0; i < out->size(); ++i) {
      const RequestTensor& t = kRequestTensors[i];
      (*out)[i] = {.request = find(v1::ComputeLossRequest::descriptor(), t),
                   .header = find(v1::StreamHeader::descriptor(), t),
                   .block = find(v1::RowBlock::descriptor(), t)};
    }
    return out;
  }();
  // `tensor` is an entry of kRequestTensors (every caller iterates it).
  return (*fields)[&tensor - kRequestTensors];
}

// The message field `field` of `message`, or null when unset or when the
// message has no such field (a small tensor in a RowBlock). The
// field's type is the one the table promises (tests/proto checks it), so the
// cast is to the generated class the field holds.
template <typename Field>
const Field* FindField(const Message& message, const FieldDescriptor* field) {
  if (field == nullptr) return nullptr;
  const google::protobuf::Reflection& reflection = *message.GetReflection();
  if (!reflection.HasField(message, field)) return nullptr;
  return &static_cast<const Field&>(reflection.GetMessage(message, field));
}

template <typename Field>
Field* MutableField(Message& message, const FieldDescriptor* field) {
  return static_cast<Field*>(
      message.GetReflection()->MutableMessage(&message, field));
}

}  // namespace

absl::Span<const std::reference_wrapper<const RequestTensor>> PerRowTensors() {
  static const auto* const per_row = [] {
    auto* out = new std::vector<std::reference_wrapper<const RequestTensor>>;
    for (const RequestTensor& tensor : kRequestTensors) {
      if (tensor.role == TensorRole::kPerRow) out->push_back(tensor);
    }
    return out;
  }();
  return *per_row;
}

const RequestTensor* FindRequestTensor(absl::string_view name) {
  for (const RequestTensor& tensor : kRequestTensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::string DTypeRuleText(DTypeRule rule) {
  const absl::Span<const DType> dtypes = DTypesOf(rule);
  std::string text = DTypeName(dtypes.front());
  for (size_t i = 1; i < dtypes.size(); ++i) {
    absl::StrAppend(&text, i + 1 == dtypes.size() ? " or " : ", ",
                    DTypeName(dtypes[i]));
  }
  return text;
}

RequestForm FormOf(const v1::ComputeLossRequest& request) {
  return request.has_query() ? RequestForm::kProjections : RequestForm::kLogits;
}

RequestForm FormOf(const v1::StreamHeader& header) {
  return header.has_query() ? RequestForm::kProjections : RequestForm::kLogits;
}

bool TakenIn(RequestForm form, const RequestTensor& tensor) {
  return form == RequestForm::kProjections
             ? !std::holds_alternative<std::monostate>(tensor.projections)
             : !std::holds_alternative<std::monostate>(tensor.logits);
}

bool RequiredIn(RequestForm form, const RequestTensor& tensor) {
  return form == RequestForm::kProjections
             ? std::holds_alternative<TensorView ProjectionsInputs::*>(
                   tensor.projections)
             : std::holds_alternative<TensorView IndexerKlInputs::*>(
                   tensor.logits);
}

const v1::Tensor* FindTensor(const v1::ComputeLossRequest& request,
                             const RequestTensor& tensor) {
  return FindField<v1::Tensor>(request, FieldsOf(tensor).request);
}

v1::Tensor* MutableTensor(v1::ComputeLossRequest& request,
                          const RequestTensor& tensor) {
  return MutableField<v1::Tensor>(request, FieldsOf(tensor).request);
}

const v1::Tensor* FindTensor(const v1::StreamHeader& header,
                             const RequestTensor& tensor) {
  return FindField<v1::Tensor>(header, FieldsOf(tensor).header);
}

v1::Tensor* MutableTensor(v1::StreamHeader& header,
                          const RequestTensor& tensor) {
  return MutableField<v1::Tensor>(header, FieldsOf(tensor).header);
}

const v1::TensorSpec* FindSpec(const v1::StreamHeader& header,
                               const RequestTensor& tensor) {
  return FindField<v1::TensorSpec>(header, FieldsOf(tensor).header);
}

v1::TensorSpec* MutableSpec(v1::StreamHeader& header,
                            const RequestTensor& tensor) {
  return MutableField<v1::TensorSpec>(header, FieldsOf(tensor).header);
}

const std::string& BlockBytes(const v1::RowBlock& block,
                              const RequestTensor& tensor) {
  // Without a Cord field the reflection returns the message's own string
  // and never touches the scratch.
  std::string scratch;
  return block.GetReflection()->GetStringReference(
      block, FieldsOf(tensor).block, &scratch);
}

namespace {

template <typename Inputs>
const TensorView* FindMember(const Inputs& inputs,
                             const InputMember<Inputs>& member) {
  if (const auto* required = std::get_if<TensorView Inputs::*>(&member)) {
    return &(inputs.**required);
  }
  if (const auto* optional =
          std::get_if<std::optional<TensorView> Inputs::*>(&member)) {
    const std::optional<TensorView>& view = inputs.**optional;
    return view.has_value() ? &*view : nullptr;
  }
  return nullptr;
}

template <typename Inputs>
void SetMember(const InputMember<Inputs>& member, TensorView view,
               Inputs& inputs) {
  if (const auto* required = std::get_if<TensorView Inputs::*>(&member)) {
    inputs.** required = std::move(view);
  } else if (const auto* optional =
                 std::get_if<std::optional<TensorView> Inputs::*>(&member)) {
    inputs.** optional = std::move(view);
  }
}

}  // namespace

const TensorView* FindInput(const IndexerKlInputs& inputs,
                            const RequestTensor& tensor) {
  return FindMember(inputs, tensor.logits);
}

const TensorView* FindInput(const ProjectionsInputs& inputs,
                            const RequestTensor& tensor) {
  return FindMember(inputs, tensor.projections);
}

void SetInput(const RequestTensor& tensor, TensorView view,
              IndexerKlInputs& inputs) {
  SetMember(tensor.logits, std::move(view), inputs);
}

void SetInput(const RequestTensor& tensor, TensorView view,
              ProjectionsInputs& inputs) {
  SetMember(tensor.projections, std::move(view), inputs);
}

}  // namespace klserve
