// The tensor table against the proto: every tensor field of the request
// messages has its entry, and every entry reaches the fields and the
// IndexerKlInputs and ProjectionsInputs members it names. A tensor added to
// klserve.proto but not to the table (or the reverse) fails here rather than
// being skipped quietly.

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

TEST(RequestTensors, StreamHeaderHasSpecsOfPerRowTensorsAndWholeTheRest) {
  const Descriptor& header = *v1::StreamHeader::descriptor();
  EXPECT_EQ(FieldsOfType(header, *v1::TensorSpec::descriptor()),
            TableNames(TensorRole::kPerRow));
  std::set<std::string> whole = TableNames(TensorRole::kSmall);
  whole.merge(TableNames(TensorRole::kKeySide));
  EXPECT_EQ(FieldsOfType(header, *v1::Tensor::descriptor()), whole);
  EXPECT_EQ(TableNames(TensorRole::kKeySide),
            (std::set<std::string>{"key", "index_key"}));
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
  EXPECT_EQ(header.key_end().dtype(), "key_end");
  EXPECT_EQ(header.query().dtype(), "query");
  EXPECT_EQ(header.lse().dtype(), "lse");
  EXPECT_EQ(header.index_key().dtype(), "index_key");
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
  EXPECT_EQ(block.index_weights(), "index_weights");
  EXPECT_EQ(block.lse(), "lse");
  const Descriptor& descriptor = *v1::RowBlock::descriptor();
  for (const RequestTensor& tensor : PerRowTensors()) {
    const FieldDescriptor* field =
        descriptor.FindFieldByName(std::string(tensor.name));
    ASSERT_NE(field, nullptr) << tensor.name;
    EXPECT_EQ(block.GetReflection()->GetString(block, field), tensor.name);
    EXPECT_EQ(BlockBytes(block, tensor), tensor.name);
  }
}

// The tensors every request of `form` must carry.
std::set<std::string> RequiredNames(RequestForm form) {
  std::set<std::string> names;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (RequiredIn(form, tensor)) names.insert(std::string(tensor.name));
  }
  return names;
}

TEST(RequestTensors, EachFormRequiresItsOwnTensors) {
  EXPECT_EQ(RequiredNames(RequestForm::kLogits),
            std::set<std::string>{"indexer_scores"});
  EXPECT_EQ(RequiredNames(RequestForm::kProjections),
            (std::set<std::string>{"query", "key", "index_query", "index_key",
                                   "index_weights"}));
  for (const RequestTensor& tensor : kRequestTensors) {
    for (const RequestForm form :
         {RequestForm::kLogits, RequestForm::kProjections}) {
      EXPECT_TRUE(!RequiredIn(form, tensor) || TakenIn(form, tensor))
          << tensor.name;
    }
  }
}

// Only the projections tensors are the projections form's alone; the
// target and the scores are the logits forms' alone; the masks, key bounds
// and topk_indices are both's.
TEST(RequestTensors, FormsShareTheMasksAndKeyBounds) {
  const std::set<std::string> projections_only = {
      "query", "key", "lse", "index_query", "index_key", "index_weights"};
  for (const RequestTensor& tensor : kRequestTensors) {
    const bool logits = TakenIn(RequestForm::kLogits, tensor);
    const bool projections = TakenIn(RequestForm::kProjections, tensor);
    EXPECT_TRUE(logits || projections) << tensor.name;
    EXPECT_EQ(!logits, projections_only.count(std::string(tensor.name)) > 0)
        << tensor.name;
    // The key side is the projections form's alone.
    EXPECT_TRUE(tensor.role != TensorRole::kKeySide || !logits) << tensor.name;
    const bool logits_only = tensor.name == "attention_logits" ||
                             tensor.name == "attention_weights" ||
                             tensor.name == "indexer_scores";
    EXPECT_EQ(!projections, logits_only) << tensor.name;
  }
}

TEST(RequestTensors, QuerySelectsTheProjectionsForm) {
  v1::ComputeLossRequest request;
  request.mutable_indexer_scores();
  EXPECT_EQ(FormOf(request), RequestForm::kLogits);
  request.mutable_query();
  EXPECT_EQ(FormOf(request), RequestForm::kProjections);
  v1::StreamHeader header;
  header.mutable_indexer_scores();
  EXPECT_EQ(FormOf(header), RequestForm::kLogits);
  header.mutable_query();
  EXPECT_EQ(FormOf(header), RequestForm::kProjections);
}

// Each entry a form takes has its own member of that form's inputs: a
// distinct value set through each is read back under its own name only.
template <typename Inputs>
void ExpectDistinctMembers(RequestForm form) {
  Inputs inputs;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (!RequiredIn(form, tensor)) {
      EXPECT_EQ(FindInput(inputs, tensor), nullptr) << tensor.name;
    }
  }
  const auto number = [](const RequestTensor& tensor) {
    return &tensor - kRequestTensors + 1;
  };
  for (const RequestTensor& tensor : kRequestTensors) {
    TensorView view;
    view.byte_size = number(tensor);
    if (TakenIn(form, tensor)) SetInput(tensor, view, inputs);
  }
  for (const RequestTensor& tensor : kRequestTensors) {
    const TensorView* view = FindInput(inputs, tensor);
    if (!TakenIn(form, tensor)) {
      EXPECT_EQ(view, nullptr) << tensor.name;
      continue;
    }
    ASSERT_NE(view, nullptr) << tensor.name;
    EXPECT_EQ(view->byte_size, number(tensor)) << tensor.name;
  }
}

TEST(RequestTensors, LogitsInputMembersAreDistinct) {
  ExpectDistinctMembers<IndexerKlInputs>(RequestForm::kLogits);
  // The members by their own names hold their entries' views.
  IndexerKlInputs inputs;
  TensorView view;
  view.byte_size = 7;
  SetInput(*FindRequestTensor("key_start"), view, inputs);
  ASSERT_TRUE(inputs.key_start.has_value());
  EXPECT_EQ(inputs.key_start->byte_size, 7);
  EXPECT_FALSE(inputs.key_end.has_value());
  SetInput(*FindRequestTensor("indexer_scores"), view, inputs);
  EXPECT_EQ(inputs.indexer_scores.byte_size, 7);
}

TEST(RequestTensors, ProjectionsInputMembersAreDistinct) {
  ExpectDistinctMembers<ProjectionsInputs>(RequestForm::kProjections);
  ProjectionsInputs inputs;
  TensorView view;
  view.byte_size = 9;
  SetInput(*FindRequestTensor("index_key"), view, inputs);
  EXPECT_EQ(inputs.index_key.byte_size, 9);
  EXPECT_EQ(inputs.key.byte_size, 0);
  SetInput(*FindRequestTensor("lse"), view, inputs);
  ASSERT_TRUE(inputs.lse.has_value());
  EXPECT_EQ(inputs.lse->byte_size, 9);
}

}  // namespace
}  // namespace klserve
