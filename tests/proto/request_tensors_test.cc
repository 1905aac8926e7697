// The tensor table against the proto: every tensor field of the request
// messages has its entry, and every entry reaches the fields and the
// IndexerKlInputs member it names. A tensor added to klserve.proto but not to
// the table (or the reverse) fails here rather than being skipped quietly.

#include "proto/request_tensors.h"

#include <iterator>
#include <optional>
#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace klserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Names of `message`'s fields that are singular messages of type `type`.
std::set<std::string> FieldsOfType(const Descriptor& message,
                                   const Descriptor& type) {
  std::set<std::string> names;
  for (int i = 0; i < message.field_count(); ++i) {
    const FieldDescriptor& field = *message.field(i);
    if (field.type() == FieldDescriptor::TYPE_MESSAGE && !field.is_repeated() &&
        field.message_type() == &type) {
      names.insert(field.name());
    }
  }
  return names;
}

std::set<std::string> BytesFields(const Descriptor& message) {
  std::set<std::string> names;
  for (int i = 0; i < message.field_count(); ++i) {
    const FieldDescriptor& field = *message.field(i);
    if (field.type() == FieldDescriptor::TYPE_BYTES) {
      names.insert(field.name());
    }
  }
  return names;
}

std::set<std::string> TableNames(std::optional<TensorRole> role) {
  std::set<std::string> names;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (!role.has_value() || tensor.role == *role) {
      names.insert(std::string(tensor.name));
    }
  }
  return names;
}

TEST(RequestTensors, EveryTensorOfComputeLossRequestIsInTheTable) {
  EXPECT_EQ(FieldsOfType(*v1::ComputeLossRequest::descriptor(),
                         *v1::Tensor::descriptor()),
            TableNames(std::nullopt));
}

TEST(RequestTensors, StreamHeaderHasSpecsOfPerRowTensorsAndSmallTensors) {
  const Descriptor& header = *v1::StreamHeader::descriptor();
  EXPECT_EQ(FieldsOfType(header, *v1::TensorSpec::descriptor()),
            TableNames(TensorRole::kPerRow));
  EXPECT_EQ(FieldsOfType(header, *v1::Tensor::descriptor()),
            TableNames(TensorRole::kSmall));
}

TEST(RequestTensors, RowBlockHasTheBytesOfEveryPerRowTensor) {
  EXPECT_EQ(BytesFields(*v1::RowBlock::descriptor()),
            TableNames(TensorRole::kPerRow));
}

TEST(RequestTensors, NamesAreUniqueAndFound) {
  EXPECT_EQ(TableNames(std::nullopt).size(), std::size(kRequestTensors));
  for (const RequestTensor& tensor : kRequestTensors) {
    EXPECT_EQ(FindRequestTensor(tensor.name), &tensor) << tensor.name;
  }
  EXPECT_EQ(FindRequestTensor("attention"), nullptr);
}

TEST(RequestTensors, PerRowEntriesAndOnlyThoseHaveABlockForm) {
  for (const RequestTensor& tensor : kRequestTensors) {
    const bool per_row = tensor.role == TensorRole::kPerRow;
    EXPECT_EQ(tensor.mutable_block_bytes != nullptr, per_row) << tensor.name;
    EXPECT_EQ(!tensor.block_layout.empty(), per_row) << tensor.name;
    EXPECT_TRUE(!tensor.per_head || per_row) << tensor.name;
  }
  EXPECT_EQ(PerRowTensors().size(), TableNames(TensorRole::kPerRow).size());
}

// Each accessor reaches the field of its entry's name: a distinct value
// written through one is read back under that name only.
TEST(RequestTensors, RequestAccessorsReachTheNamedFields) {
  v1::ComputeLossRequest request;
  for (const RequestTensor& tensor : kRequestTensors) {
    EXPECT_EQ(FindTensor(request, tensor), nullptr) << tensor.name;
    MutableTensor(request, tensor)->set_dtype(std::string(tensor.name));
  }
  const Descriptor& descriptor = *v1::ComputeLossRequest::descriptor();
  for (const RequestTensor& tensor : kRequestTensors) {
    const FieldDescriptor* field =
        descriptor.FindFieldByName(std::string(tensor.name));
    ASSERT_NE(field, nullptr) << tensor.name;
    const auto& by_name = static_cast<const v1::Tensor&>(
        request.GetReflection()->GetMessage(request, field));
    EXPECT_EQ(by_name.dtype(), tensor.name);
    ASSERT_NE(FindTensor(request, tensor), nullptr) << tensor.name;
    EXPECT_EQ(FindTensor(request, tensor)->dtype(), tensor.name);
  }
}

TEST(RequestTensors, HeaderAccessorsReachTheNamedFields) {
  v1::StreamHeader header;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (tensor.role == TensorRole::kPerRow) {
      EXPECT_EQ(FindSpec(header, tensor), nullptr) << tensor.name;
      MutableSpec(header, tensor)->set_dtype(std::string(tensor.name));
    } else {
      EXPECT_EQ(FindTensor(header, tensor), nullptr) << tensor.name;
      MutableTensor(header, tensor)->set_dtype(std::string(tensor.name));
    }
  }
  EXPECT_EQ(header.attention_logits().dtype(), "attention_logits");
  EXPECT_EQ(header.row_valid().dtype(), "row_valid");
  for (const RequestTensor& tensor : kRequestTensors) {
    const std::string dtype = tensor.role == TensorRole::kPerRow
                                  ? FindSpec(header, tensor)->dtype()
                                  : FindTensor(header, tensor)->dtype();
    EXPECT_EQ(dtype, tensor.name);
  }
}

TEST(RequestTensors, BlockBytesAreWrittenAndReadInTheNamedField) {
  v1::RowBlock block;
  for (const RequestTensor& tensor : PerRowTensors()) {
    *tensor.mutable_block_bytes(block) = std::string(tensor.name);
  }
  EXPECT_EQ(block.attention_logits(), "attention_logits");
  EXPECT_EQ(block.attention_mask(), "attention_mask");
  const Descriptor& descriptor = *v1::RowBlock::descriptor();
  for (const RequestTensor& tensor : PerRowTensors()) {
    const FieldDescriptor* field =
        descriptor.FindFieldByName(std::string(tensor.name));
    ASSERT_NE(field, nullptr) << tensor.name;
    EXPECT_EQ(block.GetReflection()->GetString(block, field), tensor.name);
    EXPECT_EQ(BlockBytes(block, tensor), tensor.name);
  }
}

// Each entry has its own IndexerKlInputs member, and exactly one (the
// scores) is required.
TEST(RequestTensors, InputMembersAreDistinct) {
  IndexerKlInputs inputs;
  int required = 0;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (IsRequired(tensor)) {
      ++required;
      EXPECT_EQ(tensor.name, "indexer_scores");
    } else {
      EXPECT_EQ(FindInput(inputs, tensor), nullptr) << tensor.name;
    }
  }
  EXPECT_EQ(required, 1);
  int64_t i = 0;
  for (const RequestTensor& tensor : kRequestTensors) {
    TensorView view;
    view.byte_size = ++i;
    SetInput(tensor, view, inputs);
  }
  // The members by their own names hold their entries' views.
  const auto number = [](absl::string_view name) {
    return FindRequestTensor(name) - kRequestTensors + 1;
  };
  EXPECT_EQ(inputs.attention_logits->byte_size, number("attention_logits"));
  EXPECT_EQ(inputs.indexer_scores.byte_size, number("indexer_scores"));
  EXPECT_EQ(inputs.row_valid->byte_size, number("row_valid"));
  i = 0;
  for (const RequestTensor& tensor : kRequestTensors) {
    const TensorView* view = FindInput(inputs, tensor);
    ASSERT_NE(view, nullptr) << tensor.name;
    EXPECT_EQ(view->byte_size, ++i) << tensor.name;
  }
}

}  // namespace
}  // namespace klserve
