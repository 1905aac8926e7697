// The translation between wire messages and the kernels' views: views point
// into the messages (no copies) and malformed fields name themselves.

#include "server/codec/tensor_codec.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/projections_computation.h"

namespace klserve::server {
namespace {

// The regions of a call on a server that serves none.
CallRegions& NoRegions() {
  static CallRegions* regions = new CallRegions(nullptr);
  return *regions;
}

v1::Tensor MakeTensor(const std::string& dtype, std::vector<int64_t> shape,
                      size_t bytes) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_data()->assign(bytes, '\0');
  return t;
}

TEST(TensorCodec, ViewPointsIntoTheMessageBytes) {
  const v1::Tensor t = MakeTensor("BF16", {2, 3}, 12);
  absl::StatusOr<TensorView> view = ViewOf("indexer_scores", t);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->data, t.data().data());
  EXPECT_EQ(view->byte_size, 12);
  EXPECT_EQ(view->dtype, DType::kBFloat16);
  EXPECT_EQ(view->shape, (absl::InlinedVector<int64_t, 4>{2, 3}));
}

TEST(TensorCodec, RejectsUnknownDTypeNamingTheField) {
  const v1::Tensor t = MakeTensor("FP8", {1}, 1);
  absl::StatusOr<TensorView> view = ViewOf("attention_logits", t);
  ASSERT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(view.status().message().rfind("attention_logits.dtype:", 0), 0u)
      << view.status();
}

TEST(TensorCodec, UnaryInputsViewEveryTensorInPlace) {
  v1::ComputeLossRequest request;
  *request.mutable_attention_weights() = MakeTensor("FP32", {1, 2, 4}, 32);
  *request.mutable_indexer_scores() = MakeTensor("FP32", {1, 2, 4}, 32);
  *request.mutable_row_valid() = MakeTensor("BOOL", {1, 2}, 2);
  absl::StatusOr<IndexerKlInputs> in = InputsFrom(request, NoRegions());
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->attention_weights->data,
            request.attention_weights().data().data());
  EXPECT_EQ(in->indexer_scores.data, request.indexer_scores().data().data());
  EXPECT_EQ(in->row_valid->data, request.row_valid().data().data());
  EXPECT_FALSE(in->attention_logits.has_value());
  EXPECT_FALSE(in->topk_indices.has_value());
}

TEST(TensorCodec, MissingScoresAreNamed) {
  v1::ComputeLossRequest request;
  *request.mutable_attention_weights() = MakeTensor("FP32", {1, 1, 1}, 4);
  absl::StatusOr<IndexerKlInputs> in = InputsFrom(request, NoRegions());
  ASSERT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in.status().message().rfind("indexer_scores:", 0), 0u);
}

TEST(TensorCodec, OptionsDefaultsFollowTheSpec) {
  absl::StatusOr<IndexerKlOptions> options = OptionsFrom(v1::LossOptions());
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->flavor, Flavor::kExact);
  EXPECT_EQ(options->reduction, Reduction::kMean);
  EXPECT_EQ(options->scaling_factor, 1.0);
  EXPECT_EQ(options->softmax_scale, 1.0f);
  EXPECT_TRUE(options->want_grad);
  EXPECT_EQ(options->grad_dtype, DType::kFloat32);
  EXPECT_FALSE(options->q_offset.has_value());
}

TEST(TensorCodec, BadGradDTypeIsNamed) {
  v1::LossOptions o;
  o.set_grad_dtype("fp32x");
  absl::StatusOr<IndexerKlOptions> options = OptionsFrom(o);
  ASSERT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(options.status().message().rfind("grad_dtype:", 0), 0u);
}

TEST(TensorCodec, StreamHeaderGivesShapesWithoutBytes) {
  v1::StreamHeader header;
  header.mutable_attention_logits()->set_dtype("FP16");
  for (int64_t d : {2, 4, 8, 16})
    header.mutable_attention_logits()->add_shape(d);
  header.mutable_indexer_scores()->set_dtype("FP32");
  for (int64_t d : {2, 8, 16}) header.mutable_indexer_scores()->add_shape(d);
  absl::StatusOr<IndexerKlInputs> in = InputsFrom(header);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->attention_logits->data, nullptr);
  EXPECT_EQ(in->attention_logits->dtype, DType::kFloat16);
  EXPECT_EQ(in->indexer_scores.shape.size(), 3u);
  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(*in, IndexerKlOptions());
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_EQ(problem->H, 4);
  // No bytes: the rows can only come in blocks.
  EXPECT_EQ(WholeRowData(*problem, *in).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodec, BlockBytesViewTheBlock) {
  v1::RowBlock block;
  block.set_indexer_scores(std::string(64, 'x'));
  block.set_attention_weights(std::string(64, 'y'));
  const RowBlockBytes bytes = BlockBytesOf(block);
  EXPECT_EQ(bytes.scores, block.indexer_scores().data());
  EXPECT_EQ(bytes.target, block.attention_weights().data());
  EXPECT_EQ(bytes.target_bytes, 64);
  EXPECT_EQ(bytes.indices_bytes, 0);
}

}  // namespace
}  // namespace klserve::server

namespace klserve::server {
namespace {

// A projections-form request of B = 1, T = 2, S = 3 (H = H_kv = 1, D = 4,
// H_I = 2, D_I = 4), zero bytes.
v1::ComputeLossRequest ProjectionsRequest() {
  v1::ComputeLossRequest request;
  *request.mutable_query() = MakeTensor("BF16", {1, 2, 1, 4}, 16);
  *request.mutable_key() = MakeTensor("BF16", {1, 3, 1, 4}, 24);
  *request.mutable_index_query() = MakeTensor("FP32", {1, 2, 2, 4}, 64);
  *request.mutable_index_key() = MakeTensor("FP32", {1, 3, 4}, 48);
  *request.mutable_index_weights() = MakeTensor("FP32", {1, 2, 2}, 16);
  *request.mutable_key_start() = MakeTensor("INT32", {1, 2}, 8);
  *request.mutable_key_end() = MakeTensor("INT32", {1, 2}, 8);
  return request;
}

TEST(TensorCodec, ProjectionsViewsPointIntoTheMessageBytes) {
  const v1::ComputeLossRequest request = ProjectionsRequest();
  absl::StatusOr<ProjectionsInputs> in =
      ProjectionsInputsFrom(request, NoRegions());
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->query.data, request.query().data().data());
  EXPECT_EQ(in->key.data, request.key().data().data());
  EXPECT_EQ(in->index_query.data, request.index_query().data().data());
  EXPECT_EQ(in->index_key.data, request.index_key().data().data());
  EXPECT_EQ(in->index_weights.data, request.index_weights().data().data());
  ASSERT_TRUE(in->key_start.has_value());
  EXPECT_EQ(in->key_start->data, request.key_start().data().data());
  EXPECT_FALSE(in->lse.has_value());
  EXPECT_FALSE(in->topk_indices.has_value());
}

// The kernels name the form's per-row tensors; each name must be a field of
// the messages that carry it, or the stream could not find its bytes.
absl::StatusOr<ProjectionsProblem> ProjectionsProblemOf(
    const v1::ComputeLossRequest& request) {
  absl::StatusOr<ProjectionsInputs> in =
      ProjectionsInputsFrom(request, NoRegions());
  if (!in.ok()) return in.status();
  absl::StatusOr<ProjectionsOptions> options =
      ProjectionsOptionsFrom(v1::LossOptions());
  if (!options.ok()) return options.status();
  return ProjectionsProblem::Create(*in, *options);
}

TEST(TensorCodec, ProjectionsBlockBytesViewEachPerRowFieldOfTheBlock) {
  absl::StatusOr<ProjectionsProblem> problem =
      ProjectionsProblemOf(ProjectionsRequest());
  ASSERT_TRUE(problem.ok()) << problem.status();
  v1::RowBlock block;
  block.set_query(std::string(1, 'q'));
  block.set_index_query(std::string(2, 'i'));
  block.set_index_weights(std::string(3, 'w'));
  block.set_lse(std::string(4, 'l'));
  block.set_topk_indices(std::string(5, 'k'));
  block.set_attention_mask(std::string(6, 'm'));
  const ProjectionsBlockBytes bytes = ProjectionsBlockBytesOf(*problem, block);
  const auto expect = [](const void* data, int64_t size,
                         const std::string& field) {
    EXPECT_EQ(data, field.data());
    EXPECT_EQ(size, static_cast<int64_t>(field.size()));
  };
  expect(bytes.query, bytes.query_bytes, block.query());
  expect(bytes.index_query, bytes.index_query_bytes, block.index_query());
  expect(bytes.index_weights, bytes.index_weights_bytes, block.index_weights());
  expect(bytes.lse, bytes.lse_bytes, block.lse());
  expect(bytes.topk_indices, bytes.topk_indices_bytes, block.topk_indices());
  expect(bytes.attention_mask, bytes.attention_mask_bytes,
         block.attention_mask());
}

TEST(TensorCodec, ProjectionsRowOutputsNameTheirAnswerAndRegionFields) {
  absl::StatusOr<ProjectionsProblem> problem =
      ProjectionsProblemOf(ProjectionsRequest());
  ASSERT_TRUE(problem.ok()) << problem.status();
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(*problem)) {
    // The server casts what it finds to these.
    for (const auto& [message, type] :
         {std::pair{v1::GradBlock::descriptor(), v1::Tensor::descriptor()},
          std::pair{v1::ComputeLossResponse::descriptor(),
                    v1::Tensor::descriptor()},
          std::pair{v1::OutputRegions::descriptor(),
                    v1::RegionSlice::descriptor()}}) {
      const google::protobuf::FieldDescriptor* field =
          message->FindFieldByName(tensor.field);
      ASSERT_NE(field, nullptr) << message->name() << "." << tensor.field;
      EXPECT_EQ(field->message_type(), type)
          << message->name() << "." << tensor.field;
    }
  }
}

// An output placed by its name (the output tables name them) sets that
// response field alone, with the dtype and shape given, and its bytes are
// the ones returned.
TEST(TensorCodec, PlaceOutputSetsTheResponseFieldOfItsNameAlone) {
  const v1::ComputeLossRequest request;  // no region slices
  const google::protobuf::Descriptor* descriptor =
      v1::ComputeLossResponse::descriptor();
  for (const char* name : {"grad", "row_kl", "d_index_query", "d_index_key",
                           "d_index_weights", "topk_indices"}) {
    v1::ComputeLossResponse response;
    absl::StatusOr<std::byte*> bytes =
        PlaceOutput(name, "INT32", 4, {2, 3}, request, NoRegions(), response);
    ASSERT_TRUE(bytes.ok()) << name << ": " << bytes.status();
    const google::protobuf::Reflection* reflection = response.GetReflection();
    std::vector<const google::protobuf::FieldDescriptor*> set;
    reflection->ListFields(response, &set);
    ASSERT_EQ(set.size(), 1u) << name;
    EXPECT_EQ(set[0], descriptor->FindFieldByName(name)) << name;
    const auto& tensor = static_cast<const v1::Tensor&>(
        reflection->GetMessage(response, set[0]));
    EXPECT_EQ(tensor.dtype(), "INT32") << name;
    EXPECT_EQ(
        std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()),
        (std::vector<int64_t>{2, 3}))
        << name;
    ASSERT_EQ(tensor.data().size(), 24u) << name;
    EXPECT_EQ(*bytes, reinterpret_cast<const std::byte*>(tensor.data().data()))
        << name;
  }
  v1::ComputeLossResponse response;
  EXPECT_EQ(PlaceOutput("d_index_bias", "FP32", 4, {1}, request, NoRegions(),
                        response)
                .status()
                .code(),
            absl::StatusCode::kInternal);
}

TEST(TensorCodec, KeyBoundsAreViewedInTheLogitsForm) {
  v1::ComputeLossRequest request;
  *request.mutable_indexer_scores() = MakeTensor("FP32", {1, 2, 3}, 24);
  *request.mutable_key_start() = MakeTensor("INT32", {1, 2}, 8);
  *request.mutable_key_end() = MakeTensor("INT32", {1, 2}, 8);
  absl::StatusOr<IndexerKlInputs> in = InputsFrom(request, NoRegions());
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(in->key_end.has_value());
  EXPECT_EQ(in->key_end->data, request.key_end().data().data());
}

void ExpectInvalidNaming(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().rfind(field + ":", 0), 0u) << status;
}

TEST(TensorCodec, MixingTheFormsNamesTheField) {
  v1::ComputeLossRequest with_logits = ProjectionsRequest();
  *with_logits.mutable_attention_logits() =
      MakeTensor("FP32", {1, 1, 2, 3}, 24);
  ExpectInvalidNaming(ProjectionsInputsFrom(with_logits, NoRegions()).status(),
                      "attention_logits");

  v1::ComputeLossRequest logits;
  *logits.mutable_indexer_scores() = MakeTensor("FP32", {1, 2, 3}, 24);
  *logits.mutable_lse() = MakeTensor("FP32", {1, 1, 2}, 8);
  ExpectInvalidNaming(InputsFrom(logits, NoRegions()).status(), "lse");
}

TEST(TensorCodec, ProjectionsFormRequiresItsTensors) {
  v1::ComputeLossRequest request = ProjectionsRequest();
  request.clear_index_key();
  ExpectInvalidNaming(ProjectionsInputsFrom(request, NoRegions()).status(),
                      "index_key");
}

TEST(TensorCodec, ProjectionsOptionsOnlyInTheProjectionsForm) {
  v1::LossOptions o;
  o.set_topk(4);
  ExpectInvalidNaming(OptionsFrom(o).status(), "options.topk");
  v1::LossOptions scale;
  scale.set_index_weight_scale(1);
  ExpectInvalidNaming(OptionsFrom(scale).status(),
                      "options.index_weight_scale");

  o.set_use_relu(false);
  o.set_index_weight_scale(0.5);
  o.set_grad_scale(2);
  absl::StatusOr<ProjectionsOptions> options = ProjectionsOptionsFrom(o);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->topk, 4);
  EXPECT_FALSE(options->use_relu);
  EXPECT_EQ(options->index_weight_scale, 0.5);
  EXPECT_EQ(options->loss.grad_scale, 2);

  // Unset, the defaults: relu on, the scale left to the kernels.
  absl::StatusOr<ProjectionsOptions> defaults =
      ProjectionsOptionsFrom(v1::LossOptions());
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_TRUE(defaults->use_relu);
  EXPECT_FALSE(defaults->index_weight_scale.has_value());
  EXPECT_EQ(defaults->topk, 0);
}

}  // namespace
}  // namespace klserve::server
