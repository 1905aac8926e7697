// The projections form over the real server (unary ComputeLoss): for small
// problems of every shape family (MHA, GQA, MQA; dense causal with T = S and
// T != S, sparse with the client's indices or the service's own top-k, key
// bounds, BF16 and FP16 inputs, a given lse) the loss, row KL and the
// gradients of index_query, index_key and index_weights equal the float64
// reference (tests/reference/projections_reference.h), and the service's
// selection equals the reference's. Bad requests are INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED past a limit) naming the field.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "klserve/v1/klserve.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/reference_problems.h"
#include "tests/reference/projections_reference.h"

namespace klserve::integration {
namespace {

v1::LossOptions Options(v1::Flavor flavor, v1::Reduction reduction,
                        const std::string& grad_dtype) {
  v1::LossOptions o;
  o.set_flavor(flavor);
  o.set_reduction(reduction);
  o.set_grad_dtype(grad_dtype);
  o.set_want_row_kl(true);
  return o;
}

std::vector<ProjectionsSpec> AgreementSpecs() {
  std::vector<ProjectionsSpec> specs;
  {
    ProjectionsSpec s;
    s.name = "DenseCausalMha";
    s.B = 2, s.T = 6, s.S = 6, s.H = 2, s.H_kv = 2, s.D = 8;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_softmax_scale(1 / std::sqrt(8.0f));
    s.seed = 31;
    specs.push_back(s);
  }
  {
    ProjectionsSpec s;
    s.name = "GqaCausalTNotSMaxTextNoRelu";
    s.B = 1, s.T = 5, s.S = 9, s.H = 4, s.H_kv = 2, s.D = 6;
    s.H_I = 2, s.D_I = 5;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "FP32");
    s.options.set_causal(true);
    s.options.set_use_relu(false);
    s.options.set_index_weight_scale(1.0);
    s.seed = 32;
    specs.push_back(s);
  }
  {
    ProjectionsSpec s;
    s.name = "MqaSparseClientIndices";
    s.B = 2, s.T = 6, s.S = 10, s.H = 4, s.H_kv = 1, s.D = 8, s.K = 4;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_SUM, "FP32");
    s.options.set_scaling_factor(0.5);
    s.options.set_grad_scale(2.0);
    s.seed = 33;
    specs.push_back(s);
  }
  {
    ProjectionsSpec s;
    s.name = "ServerTopk";
    s.B = 2, s.T = 6, s.S = 9, s.H = 2, s.H_kv = 1, s.D = 4;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_topk(3);
    s.seed = 34;
    specs.push_back(s);
  }
  {
    ProjectionsSpec s;
    s.name = "Bf16Inputs";
    s.B = 1, s.T = 7, s.S = 7, s.H = 2, s.H_kv = 2, s.D = 8;
    s.dtype = "BF16";
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "BF16");
    s.options.set_causal(true);
    s.seed = 35;
    specs.push_back(s);
  }
  {
    ProjectionsSpec s;
    s.name = "Fp16KeyBoundsDocuments";
    s.B = 1, s.T = 12, s.S = 12, s.H = 2, s.H_kv = 1, s.D = 8;
    s.dtype = "FP16";
    s.documents = {4, 3, 5};
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN, "FP16");
    s.seed = 36;
    specs.push_back(s);
  }
  return specs;
}

// The server's answer against the reference's, to `tolerance` for the
// result and the gradient dtype's tolerance for the gradients.
void ExpectAsTheReference(const klref::RefProjectionsResult& ref,
                          const v1::ComputeLossResponse& response,
                          const std::string& grad_dtype) {
  ASSERT_TRUE(ref.kl.error.empty()) << ref.kl.error;
  EXPECT_TRUE(CloseResult(ref.kl, response, 1e-5));
  EXPECT_FALSE(response.has_grad());
  const double tolerance = GradTolerance(grad_dtype);
  for (const v1::Tensor* grad :
       {&response.d_index_query(), &response.d_index_key(),
        &response.d_index_weights()}) {
    EXPECT_EQ(grad->dtype(), grad_dtype);
  }
  EXPECT_TRUE(
      CloseTensor(ref.d_index_query, response.d_index_query(), tolerance));
  EXPECT_TRUE(CloseTensor(ref.d_index_key, response.d_index_key(), tolerance));
  EXPECT_TRUE(
      CloseTensor(ref.d_index_weights, response.d_index_weights(), tolerance));
}

class ProjectionsAgreementTest
    : public ServerTest,
      public ::testing::WithParamInterface<ProjectionsSpec> {};

TEST_P(ProjectionsAgreementTest, UnaryEqualsTheReference) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const ProjectionsSpec& spec = GetParam();
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  const klref::RefProjectionsResult ref =
      klref::ComputeProjectionsReference(RefProjectionsOf(request));
  // Small: ComputeLoss sends it unary (projections_stream_test streams).
  absl::StatusOr<v1::ComputeLossResponse> response =
      client().ComputeLoss(request);
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  EXPECT_EQ(response->request_id(), request.request_id());
  ExpectAsTheReference(ref, *response, spec.options.grad_dtype());
  const std::vector<int64_t> shape = {spec.B, spec.T, spec.H_I, spec.D_I};
  EXPECT_EQ(std::vector<int64_t>(response->d_index_query().shape().begin(),
                                 response->d_index_query().shape().end()),
            shape);
  if (spec.options.topk() > 0) {
    ASSERT_TRUE(response->has_topk_indices());
    EXPECT_EQ(response->topk_indices().dtype(), "INT32");
    EXPECT_EQ(DecodeInts(response->topk_indices()), ref.topk_indices);
  } else {
    EXPECT_FALSE(response->has_topk_indices());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Problems, ProjectionsAgreementTest, ::testing::ValuesIn(AgreementSpecs()),
    [](const ::testing::TestParamInfo<ProjectionsSpec>& info) {
      return info.param.name;
    });

TEST_F(ServerTest, ProjectionsWithLseEqualTheReference) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ProjectionsSpec spec;
  spec.name = "DenseWithLse";
  spec.B = 2, spec.T = 5, spec.S = 8, spec.H = 4, spec.H_kv = 2, spec.D = 8;
  spec.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
  spec.options.set_causal(true);
  spec.options.set_softmax_scale(0.25f);
  spec.seed = 37;
  v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  const klref::RefProjections problem = RefProjectionsOf(request);
  *request.mutable_lse() = LseOf(problem);
  absl::StatusOr<v1::ComputeLossResponse> response =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  ExpectAsTheReference(klref::ComputeProjectionsReference(problem), *response,
                       "FP32");
}

TEST_F(ServerTest, ProjectionsWithoutGradientCarryNone) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ProjectionsSpec spec;
  spec.name = "SkipGrad";
  spec.options.set_skip_grad(true);
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  absl::StatusOr<v1::ComputeLossResponse> response =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  EXPECT_FALSE(response->has_d_index_query());
  EXPECT_FALSE(response->has_d_index_key());
  EXPECT_FALSE(response->has_d_index_weights());
  EXPECT_FALSE(response->has_row_kl());
  const klref::RefProjectionsResult ref =
      klref::ComputeProjectionsReference(RefProjectionsOf(request));
  EXPECT_TRUE(CloseResult(ref.kl, *response, 1e-5));
}

class ProjectionsErrorTest : public ServerTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartServer()); }

  static v1::ComputeLossRequest Good() {
    ProjectionsSpec spec;
    spec.name = "Errors";
    spec.options.set_causal(true);
    return MakeProjectionsRequest(spec);
  }

  // The unary call's refusal: `code`, with a message naming `field` first.
  void ExpectRefused(
      const v1::ComputeLossRequest& request, const std::string& field,
      absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    absl::StatusOr<v1::ComputeLossResponse> response =
        client().ComputeLossUnary(request);
    ASSERT_FALSE(response.ok()) << field;
    EXPECT_EQ(response.status().code(), code) << Describe(response.status());
    EXPECT_TRUE(absl::StartsWith(response.status().message(), field + ":"))
        << "want " << field << ", got " << Describe(response.status());
  }
};

TEST_F(ProjectionsErrorTest, MixingTheFormsNamesTheField) {
  v1::ComputeLossRequest with_scores = Good();
  *with_scores.mutable_indexer_scores() = with_scores.index_weights();
  ExpectRefused(with_scores, "indexer_scores");
  v1::ComputeLossRequest with_weights = Good();
  *with_weights.mutable_attention_weights() = with_weights.index_weights();
  ExpectRefused(with_weights, "attention_weights");

  // The logits form given a projection, or an option of the projections
  // form.
  ProblemSpec logits_spec;
  logits_spec.name = "LogitsForm";
  const v1::ComputeLossRequest logits = MakeRequest(logits_spec);
  v1::ComputeLossRequest with_key = logits;
  *with_key.mutable_index_key() = Good().index_key();
  ExpectRefused(with_key, "index_key");
  v1::ComputeLossRequest with_topk = logits;
  with_topk.mutable_options()->set_topk(2);
  ExpectRefused(with_topk, "options.topk");
  v1::ComputeLossRequest with_relu = logits;
  with_relu.mutable_options()->set_use_relu(false);
  ExpectRefused(with_relu, "options.use_relu");
}

TEST_F(ProjectionsErrorTest, ShapesAndOptions) {
  // key's D is not query's.
  ProjectionsSpec other_d;
  other_d.name = "OtherD";
  const v1::ComputeLossRequest good = Good();
  v1::ComputeLossRequest wrong_d = good;
  other_d.D = 4;
  *wrong_d.mutable_key() = MakeProjectionsRequest(other_d).key();
  ExpectRefused(wrong_d, "key");

  // H = 3 query heads over H_kv = 2 key heads.
  ProjectionsSpec three_heads;
  three_heads.name = "ThreeHeads";
  three_heads.H = 3;
  v1::ComputeLossRequest not_divisible = good;
  *not_divisible.mutable_query() = MakeProjectionsRequest(three_heads).query();
  ExpectRefused(not_divisible, "key");

  v1::ComputeLossRequest short_weights = good;
  short_weights.mutable_index_weights()->set_shape(2, 2);
  ExpectRefused(short_weights, "index_weights");

  v1::ComputeLossRequest both_selections = good;
  both_selections.mutable_options()->set_topk(2);
  ProjectionsSpec sparse;
  sparse.name = "Sparse";
  sparse.K = 2;
  *both_selections.mutable_topk_indices() =
      MakeProjectionsRequest(sparse).topk_indices();
  ExpectRefused(both_selections, "topk");

  v1::ComputeLossRequest lse_with_topk = good;
  lse_with_topk.mutable_options()->set_topk(2);
  *lse_with_topk.mutable_lse() = LseOf(RefProjectionsOf(good));
  ExpectRefused(lse_with_topk, "lse");
}

TEST_F(ProjectionsErrorTest, NanInQueryNamesQuery) {
  v1::ComputeLossRequest request = Good();
  SetFloat(*request.mutable_query(), 17,
           std::numeric_limits<float>::quiet_NaN());
  ExpectRefused(request, "query");
}

// The projections' gradients grow with the projections: with keys 100
// times the usual size and |c / N * grad_scale| at FP16's largest value,
// d_index_query leaves FP16's range (the float64 reference says so). The
// call is refused naming the output, unary and streamed, instead of
// answering OK with infinities; the same request in FP32 is answered.
TEST_F(ProjectionsErrorTest, GradientPastItsDtypeNamesTheOutput) {
  v1::ComputeLossRequest request = Good();
  v1::Tensor& key = *request.mutable_index_key();
  const std::vector<double> keys = DecodeFloats(key);
  for (size_t i = 0; i < keys.size(); ++i) {
    SetFloat(key, static_cast<int64_t>(i), static_cast<float>(keys[i] * 100));
  }
  request.mutable_options()->set_reduction(v1::REDUCTION_SUM);
  const klref::RefProjectionsResult unit =
      klref::ComputeProjectionsReference(RefProjectionsOf(request));
  ASSERT_TRUE(unit.kl.error.empty()) << unit.kl.error;
  double largest = 0;
  for (double g : unit.d_index_query) largest = std::max(largest, std::abs(g));
  ASSERT_GT(65504 * largest, 70000);

  request.mutable_options()->set_scaling_factor(65504);
  request.mutable_options()->set_grad_dtype("FP16");
  ExpectRefused(request, "d_index_query");
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request, 2);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(streamed.status().message(), "d_index_query:"))
      << Describe(streamed.status());

  request.mutable_options()->set_grad_dtype("FP32");
  absl::StatusOr<v1::ComputeLossResponse> wide =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(wide.ok()) << Describe(wide.status());
  const klref::RefProjectionsResult ref =
      klref::ComputeProjectionsReference(RefProjectionsOf(request));
  ExpectAsTheReference(ref, *wide, "FP32");
}

// The status of the unary call of a small problem (the spec's defaults).
absl::Status SmallProblemStatus(Client& client, const std::string& name) {
  ProjectionsSpec spec;
  spec.name = name;
  return client.ComputeLossUnary(MakeProjectionsRequest(spec)).status();
}

TEST_F(ServerTest, ProjectionsTensorsAreHeldToTheTensorLimit) {
  // query is [1, 6, 2, 8] FP32: 384 bytes; index_query 288.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_tensor_bytes=300"}));
  const absl::Status status = SmallProblemStatus(client(), "TensorLimit");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(status.message(), "query:")) << Describe(status);
}

// BF16 projections of T = S = 64 and one main head of D = 1, with FP32
// gradients: the response, mostly d_index_query and d_index_key, is about
// twice the request.
v1::ComputeLossRequest GradientHeavyRequest(int64_t H_I, int64_t D_I) {
  ProjectionsSpec spec;
  spec.name = absl::StrCat("GradientHeavy", H_I, "x", D_I);
  spec.T = 64, spec.S = 64, spec.H = 1, spec.H_kv = 1, spec.D = 1;
  spec.H_I = H_I, spec.D_I = D_I;
  spec.dtype = "BF16";
  spec.options.set_grad_dtype("FP32");
  return MakeProjectionsRequest(spec);
}

// A message limit between the request and its response refuses the
// response before computing it, naming its largest part.
TEST_F(ServerTest, ProjectionsResponseIsHeldToTheMessageLimit) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=30000"}));
  const v1::ComputeLossRequest request = GradientHeavyRequest(8, 16);
  ASSERT_LT(request.ByteSizeLong(), 30000u);
  absl::StatusOr<v1::ComputeLossResponse> response =
      client().ComputeLossUnary(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(response.status().message(), "d_index_query:"))
      << Describe(response.status());
  EXPECT_TRUE(absl::StrContains(response.status().message(),
                                "send the problem with ComputeLossStream"))
      << Describe(response.status());
  // Without the gradients it fits.
  v1::ComputeLossRequest loss_only = request;
  loss_only.mutable_options()->set_skip_grad(true);
  EXPECT_TRUE(client().ComputeLossUnary(loss_only).ok());
}

// d_index_query and d_index_key of one size (T H_I = S): a unary answer
// over the message limit names d_index_query, which a stream splits into
// blocks (and so serves), not d_index_key, which it sends whole.
TEST_F(ServerTest, AnOversizeAnswerOfEqualGradientsNamesTheOneAStreamSplits) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=25000"}));
  const v1::ComputeLossRequest request = GradientHeavyRequest(1, 64);
  ASSERT_LT(request.ByteSizeLong(), 25000u);
  const absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_FALSE(unary.ok());
  EXPECT_EQ(unary.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(unary.status().message(), "d_index_query:"))
      << Describe(unary.status());
  const absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request);
  EXPECT_TRUE(streamed.ok()) << Describe(streamed.status());
}

// d_index_key the largest output (few queries, many keys): a stream would
// not serve it, as its last message carries d_index_key whole, so the
// error names what does, among them a 16-bit gradient.
TEST_F(ServerTest, AnOversizeKeyGradientNamesRemediesThatServeIt) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=50000"}));
  ProjectionsSpec spec;
  spec.name = "KeyGradientHeavy";
  spec.T = 4, spec.S = 2048, spec.H = 1, spec.H_kv = 1, spec.D = 1;
  spec.H_I = 1, spec.D_I = 8;  // index_key 32 KiB in BF16, 64 KiB in FP32
  spec.dtype = "BF16";
  spec.options.set_grad_dtype("FP32");
  v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  ASSERT_LT(request.ByteSizeLong(), 50000u);
  const absl::Status unary = client().ComputeLossUnary(request).status();
  EXPECT_EQ(unary.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(unary.message(), "d_index_key:"))
      << Describe(unary);
  for (const char* remedy :
       {"shared-memory region (outputs.d_index_key)", "16-bit grad_dtype",
        "fewer keys (batch entries) per call"}) {
    EXPECT_TRUE(absl::StrContains(unary.message(), remedy))
        << remedy << ": " << Describe(unary);
  }
  EXPECT_FALSE(absl::StrContains(unary.message(), "ComputeLossStream"))
      << Describe(unary);
  // Nor would a stream, which says what would.
  const absl::Status streamed = client().ComputeLossStreaming(request).status();
  EXPECT_EQ(streamed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(streamed.message(), "d_index_key:"))
      << Describe(streamed);
  EXPECT_TRUE(absl::StrContains(streamed.message(), "16-bit grad_dtype"))
      << Describe(streamed);
  request.mutable_options()->set_grad_dtype("BF16");
  const absl::Status bf16 = client().ComputeLossUnary(request).status();
  EXPECT_TRUE(bf16.ok()) << Describe(bf16);
}

// d_index_key the largest output but within the limit by itself: the
// outputs together pass it, and a stream, which splits the others, serves
// the problem, so the error says so (a reviewing helper's finding: it had
// said a stream would not).
TEST_F(ServerTest, AKeyGradientWithinTheLimitLeavesTheStreamAsTheRemedy) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=50000"}));
  ProjectionsSpec spec;
  spec.name = "KeyGradientLargestButWithin";
  spec.T = 1000, spec.S = 1200, spec.H = 1, spec.H_kv = 1, spec.D = 1;
  spec.H_I = 1, spec.D_I = 8;  // d_index_key 38400 bytes, d_index_query 32000
  spec.dtype = "BF16";
  spec.options.set_grad_dtype("FP32");
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  ASSERT_LT(request.ByteSizeLong(), 50000u);
  const absl::Status unary = client().ComputeLossUnary(request).status();
  EXPECT_EQ(unary.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(unary.message(), "d_index_key:"))
      << Describe(unary);
  EXPECT_TRUE(absl::StrContains(unary.message(),
                                "send the problem with ComputeLossStream"))
      << Describe(unary);
  const absl::Status streamed = client().ComputeLossStreaming(request).status();
  EXPECT_TRUE(streamed.ok()) << Describe(streamed);
}

// A projections problem's work grows with T * S from a message that grows
// with T + S: a unary computation, and each block of a stream (which
// computes on the same threads), stops at --max_compute_duration
// (DEADLINE_EXCEEDED naming the flag), which leaves the logits form alone.
TEST_F(ServerTest, ProjectionsComputationStopsAtItsTimeLimit) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_compute_duration=1us"}));
  const absl::Status status = SmallProblemStatus(client(), "TimeLimit");
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(status.message(), "(--max_compute_duration)"))
      << Describe(status);
  ProjectionsSpec spec;
  spec.name = "StreamTimeLimit";
  const absl::Status streamed =
      client().ComputeLossStreaming(MakeProjectionsRequest(spec)).status();
  EXPECT_EQ(streamed.code(), absl::StatusCode::kDeadlineExceeded)
      << Describe(streamed);
  EXPECT_TRUE(absl::StrContains(streamed.message(),
                                "a block computing for more than 1us "
                                "(--max_compute_duration)"))
      << Describe(streamed);
  ProblemSpec logits;
  logits.name = "LogitsForm";
  EXPECT_TRUE(client().ComputeLossUnary(MakeRequest(logits)).ok());
}

// Problems whose work takes one thread tens of seconds from a message of
// a few MB: one head of one dimension at T = S = 98304 (about 10^10
// query-key pairs over 6144 tiles), and a single query row against 2^20 keys
// in 8192 heads of one dimension (one tile of about 10^10 head-key pairs).
std::vector<ProjectionsSpec> LongProblems(const std::string& name) {
  ProjectionsSpec many_tiles;
  many_tiles.name = name + "ManyTiles";
  many_tiles.T = 98304, many_tiles.S = 98304;
  many_tiles.H = 1, many_tiles.H_kv = 1, many_tiles.D = 1;
  many_tiles.H_I = 1, many_tiles.D_I = 1;
  many_tiles.options.set_skip_grad(true);
  ProjectionsSpec one_tile = many_tiles;
  one_tile.name = name + "OneTile";
  one_tile.T = 1, one_tile.S = 1 << 20, one_tile.H = 8192;
  return {many_tiles, one_tile};
}

// A client that gives up (here its deadline passes) frees its slot within a
// step of a tile: the server's one compute slot takes the next request at
// once, where finishing the abandoned problem would hold it for tens of
// seconds.
TEST_F(ServerTest, ProjectionsComputationStopsWhenTheClientGivesUp) {
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--max_concurrent_requests=1", "--threads=1"}));
  for (const ProjectionsSpec& large : LongProblems("Abandoned")) {
    SCOPED_TRACE(large.name);
    std::unique_ptr<Client> impatient =
        MakeClient(server().target(), 1, absl::Milliseconds(500));
    absl::StatusOr<v1::ComputeLossResponse> abandoned =
        impatient->ComputeLossUnary(MakeProjectionsRequest(large));
    ASSERT_FALSE(abandoned.ok());
    EXPECT_EQ(abandoned.status().code(), absl::StatusCode::kDeadlineExceeded)
        << Describe(abandoned.status());

    ProjectionsSpec small;
    small.name = "Next";
    const v1::ComputeLossRequest next = MakeProjectionsRequest(small);
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    absl::StatusOr<v1::ComputeLossResponse> answered =
        client().ComputeLossUnary(next);
    while (!answered.ok() && absl::IsResourceExhausted(answered.status()) &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
      answered = client().ComputeLossUnary(next);
    }
    EXPECT_TRUE(answered.ok()) << Describe(answered.status());
  }
}

// The same for a stream's block: when the watchdog ends the stream
// (--max_stream_duration), the block being computed stops too, so the one
// compute thread is free for the next call, where finishing the block would
// hold it for tens of seconds.
TEST_F(ServerTest, ProjectionsBlockStopsWhenItsStreamEnds) {
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--max_concurrent_requests=1", "--threads=1",
                   "--max_stream_duration=1s"}));
  for (const ProjectionsSpec& large : LongProblems("LongBlock")) {
    SCOPED_TRACE(large.name);
    const v1::ComputeLossRequest request = MakeProjectionsRequest(large);
    absl::StatusOr<v1::ComputeLossResponse> ended =
        client().ComputeLossStreaming(request, large.T);
    ASSERT_FALSE(ended.ok());
    EXPECT_EQ(ended.status().code(), absl::StatusCode::kDeadlineExceeded)
        << Describe(ended.status());

    ProjectionsSpec small;
    small.name = "Next";
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::ComputeLossResponse> answered =
        client().ComputeLossUnary(MakeProjectionsRequest(small));
    EXPECT_TRUE(answered.ok()) << Describe(answered.status());
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  }
}

}  // namespace
}  // namespace klserve::integration
