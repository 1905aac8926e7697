// Bad requests, through the wire: every validation rule of the spec and the
// API answers INVALID_ARGUMENT whose message starts with the offending field
// (RESOURCE_EXHAUSTED for the server's limits), unary and streamed, and the
// server keeps answering good requests correctly afterwards.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/stream_codec.h"
#include "tests/integration/harness.h"

namespace klserve::integration {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The good request sent after every bad one, and its library answer.
const v1::ComputeLossRequest& GoodRequest() {
  static const v1::ComputeLossRequest* request = [] {
    ProblemSpec s;
    s.name = "good";
    s.B = 2, s.T = 5, s.S = 9, s.H = 2;
    s.target_dtype = "BF16";
    s.segments = true;
    // With an attention mask: the streamed-row-mask bug (see
    // loss_agreement_test) stays out of this check; the agreement tests
    // cover it.
    s.attention_mask = true;
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(3);
    s.seed = 7;
    return new v1::ComputeLossRequest(MakeRequest(s));
  }();
  return *request;
}

const v1::ComputeLossResponse& GoodResponse() {
  static const v1::ComputeLossResponse* response = [] {
    absl::StatusOr<v1::ComputeLossResponse> r = LibraryCompute(GoodRequest());
    EXPECT_TRUE(r.ok()) << r.status();
    return new v1::ComputeLossResponse(r.ok() ? *r : v1::ComputeLossResponse());
  }();
  return *response;
}

// Bases the bad requests are made from. Dense: B=2, T=S=4, causal (so
// (t=0, s=3) is masked), per-head H=2 or head-aggregated. Sparse: B=1, T=3,
// S=10, K=4, slot 3 of every row empty.
constexpr int64_t kB = 2, kT = 4, kS = 4, kH = 2;

v1::ComputeLossRequest DensePerHead(const std::string& dtype = "FP32") {
  ProblemSpec s;
  s.name = "dense";
  s.B = kB, s.T = kT, s.S = kS, s.H = kH;
  s.target_dtype = s.scores_dtype = dtype;
  s.options.set_causal(true);
  s.seed = 3;
  return MakeRequest(s);
}

v1::ComputeLossRequest DenseAggregated() {
  ProblemSpec s;
  s.name = "aggregated";
  s.B = kB, s.T = kT, s.S = kS, s.H = 0;
  s.options.set_causal(true);
  s.seed = 4;
  v1::ComputeLossRequest r = MakeRequest(s);
  // Every weight positive, so that each valid key has p > 0.
  for (int64_t i = 0; i < kB * kT * kS; ++i) {
    SetFloat(*r.mutable_attention_weights(), i, 0.25f + 0.01f * i);
  }
  return r;
}

v1::ComputeLossRequest Sparse() {
  v1::ComputeLossRequest r;
  r.set_request_id("sparse");
  r.mutable_options()->set_num_keys(10);
  const int32_t topk[] = {0, 5, 9, -1, 2, 3, 4, -1, 7, 1, 8, -1};
  v1::Tensor* indices = r.mutable_topk_indices();
  indices->set_dtype("INT32");
  for (int64_t d : {1, 3, 4}) indices->add_shape(d);
  indices->set_data(
      std::string(reinterpret_cast<const char*>(topk), sizeof(topk)));
  std::vector<float> weights(12), scores(12);
  for (int i = 0; i < 12; ++i) {
    weights[i] = 0.5f + 0.1f * (i % 5);
    scores[i] = 0.3f * (i % 7) - 1.0f;
  }
  for (auto [tensor, values] :
       {std::pair{r.mutable_attention_weights(), &weights},
        std::pair{r.mutable_indexer_scores(), &scores}}) {
    tensor->set_dtype("FP32");
    for (int64_t d : {1, 3, 4}) tensor->add_shape(d);
    tensor->set_data(EncodeFloats(*values, "FP32"));
  }
  return r;
}

// Flat indices.
int64_t ScoreAt(int64_t b, int64_t t, int64_t s) {
  return (b * kT + t) * kS + s;
}
int64_t LogitAt(int64_t b, int64_t h, int64_t t, int64_t s) {
  return ((b * kH + h) * kT + t) * kS + s;
}

void SetShape(v1::Tensor* t, std::vector<int64_t> shape) {
  t->clear_shape();
  for (int64_t d : shape) t->add_shape(d);
}

void SetTopk(v1::ComputeLossRequest& r, int64_t index, int32_t value) {
  std::memcpy(r.mutable_topk_indices()->mutable_data()->data() + 4 * index,
              &value, 4);
}

// Segment ids that put every query and key in segment 0 (they change no
// validity).
void AddSegments(v1::ComputeLossRequest& r) {
  for (auto [t, n] : {std::pair{r.mutable_segment_ids_q(), kT},
                      std::pair{r.mutable_segment_ids_kv(), kS}}) {
    t->set_dtype("INT32");
    SetShape(t, {kB, n});
    t->set_data(std::string(kB * n * 4, '\0'));
  }
}

struct BadCase {
  std::string name;
  std::function<v1::ComputeLossRequest()> make;
  std::string field;  // the message must start with it
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  // Whether IndexerKlProblem::Create + ComputeIndexerKl refuse it too (not
  // for wire-only errors such as an unknown enum value).
  bool library_rejects = true;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

std::vector<BadCase> BadCases() {
  using R = v1::ComputeLossRequest;
  std::vector<BadCase> cases = {
      // Shapes, byte sizes and dtypes.
      {"ScoresByteSizeMismatch",
       [] {
         R r = DensePerHead();
         r.mutable_indexer_scores()->mutable_data()->resize(kB * kT * kS * 4 -
                                                            4);
         return r;
       },
       "indexer_scores"},
      {"LogitsByteSizeMismatch",
       [] {
         R r = DensePerHead();
         r.mutable_attention_logits()->mutable_data()->append("xx");
         return r;
       },
       "attention_logits"},
      {"LogitsShapeDisagreesWithScores",
       [] {
         R r = DensePerHead();
         SetShape(r.mutable_attention_logits(), {kB, kH, kT + 1, kS});
         r.mutable_attention_logits()->mutable_data()->resize(
             kB * kH * (kT + 1) * kS * 4);
         return r;
       },
       "attention_logits"},
      {"WeightsShapeDisagreesWithScores",
       [] {
         R r = DenseAggregated();
         SetShape(r.mutable_attention_weights(), {kB, kT, kS + 1});
         r.mutable_attention_weights()->mutable_data()->resize(kB * kT *
                                                               (kS + 1) * 4);
         return r;
       },
       "attention_weights"},
      {"ScoresWrongRank",
       [] {
         R r = DensePerHead();
         SetShape(r.mutable_indexer_scores(), {kB * kT, kS});
         return r;
       },
       "indexer_scores"},
      {"UnknownDtypeName",
       [] {
         R r = DensePerHead();
         r.mutable_indexer_scores()->set_dtype("FLOAT32");
         return r;
       },
       "indexer_scores"},
      {"LowercaseDtypeName",
       [] {
         R r = DensePerHead();
         r.mutable_attention_logits()->set_dtype("fp32");
         return r;
       },
       "attention_logits"},
      {"ScoresDtypeInt32NotAllowed",
       [] {
         R r = DensePerHead();
         r.mutable_indexer_scores()->set_dtype("INT32");
         return r;
       },
       "indexer_scores"},
      {"LogitsDtypeBoolNotAllowed",
       [] {
         R r = DensePerHead();
         r.mutable_attention_logits()->set_dtype("BOOL");
         r.mutable_attention_logits()->mutable_data()->resize(kB * kH * kT *
                                                              kS);
         return r;
       },
       "attention_logits"},
      {"TopkDtypeFp32NotAllowed",
       [] {
         R r = Sparse();
         r.mutable_topk_indices()->set_dtype("FP32");
         return r;
       },
       "topk_indices"},
      {"AttentionMaskDtypeFp32NotAllowed",
       [] {
         R r = DensePerHead();
         v1::Tensor* m = r.mutable_attention_mask();
         m->set_dtype("FP32");
         SetShape(m, {kB, kT, kS});
         m->set_data(
             EncodeFloats(std::vector<float>(kB * kT * kS, 1.0f), "FP32"));
         return r;
       },
       "attention_mask"},
      {"SegmentIdsDtypeBoolNotAllowed",
       [] {
         R r = DensePerHead();
         for (v1::Tensor* t :
              {r.mutable_segment_ids_q(), r.mutable_segment_ids_kv()}) {
           t->set_dtype("BOOL");
           SetShape(t, {kB, kT});
           t->set_data(std::string(kB * kT, '\1'));
         }
         return r;
       },
       "segment_ids_q"},
      {"RowValidWrongShape",
       [] {
         R r = DensePerHead();
         v1::Tensor* t = r.mutable_row_valid();
         t->set_dtype("BOOL");
         SetShape(t, {kB, kT + 1});
         t->set_data(std::string(kB * (kT + 1), '\1'));
         return r;
       },
       "row_valid"},
      {"KeyPaddingMaskWrongShape",
       [] {
         R r = DensePerHead();
         v1::Tensor* t = r.mutable_key_padding_mask();
         t->set_dtype("BOOL");
         SetShape(t, {kB, kS, 1});
         t->set_data(std::string(kB * kS, '\1'));
         return r;
       },
       "key_padding_mask"},
      // Streamed, the client's RequestSlicer checks the scores before the
      // target that must agree with them, so it names indexer_scores too.
      {"OverflowingDims",
       [] {
         R r = DensePerHead();
         SetShape(r.mutable_indexer_scores(),
                  {int64_t{1} << 40, int64_t{1} << 40, 4});
         return r;
       },
       "indexer_scores"},
      {"OverflowingLogitsDims",
       [] {
         R r = DensePerHead();
         SetShape(r.mutable_attention_logits(), {kB, int64_t{1} << 61, kT, kS});
         return r;
       },
       "attention_logits"},
      {"ZeroDim",
       [] {
         R r = DensePerHead();
         SetShape(r.mutable_indexer_scores(), {kB, 0, kS});
         r.mutable_indexer_scores()->clear_data();
         return r;
       },
       "indexer_scores"},
      {"NegativeDim",
       [] {
         R r = DensePerHead();
         SetShape(r.mutable_indexer_scores(), {kB, -kT, kS});
         return r;
       },
       "indexer_scores"},
      {"MissingScores",
       [] {
         R r = DensePerHead();
         r.clear_indexer_scores();
         return r;
       },
       "indexer_scores"},
      // Top-k indices.
      {"TopkDuplicateKey",
       [] {
         R r = Sparse();
         SetTopk(r, 9, 7);  // row 2: 7, 7, 8, -1
         return r;
       },
       "topk_indices"},
      {"SparseWithoutNumKeys",
       [] {
         R r = Sparse();
         r.mutable_options()->clear_num_keys();
         return r;
       },
       "num_keys"},
      {"DenseNumKeysNotS",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_num_keys(kS + 1);
         return r;
       },
       "num_keys"},
      // Values, wherever they sit.
      {"NaNInScores",
       [] {
         R r = DensePerHead();
         SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 2, 1), kNaN);
         return r;
       },
       "indexer_scores"},
      {"NaNInScoresAtMaskedPosition",
       [] {
         R r = DensePerHead();
         SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 0, 3), kNaN);
         return r;
       },
       "indexer_scores"},
      {"PlusInfInScores",
       [] {
         R r = DensePerHead();
         SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 3, 0), kInf);
         return r;
       },
       "indexer_scores"},
      {"PlusInfInScoresAtMaskedPosition",
       [] {
         R r = DensePerHead();
         SetFloat(*r.mutable_indexer_scores(), ScoreAt(0, 1, 2), kInf);
         return r;
       },
       "indexer_scores"},
      {"NaNInBf16Scores",
       [] {
         R r = DensePerHead("BF16");
         SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 1, 0), kNaN);
         return r;
       },
       "indexer_scores"},
      {"NaNInFp16Logits",
       [] {
         R r = DensePerHead("FP16");
         SetFloat(*r.mutable_attention_logits(), LogitAt(1, 1, 3, 2), kNaN);
         return r;
       },
       "attention_logits"},
      {"NaNInLogits",
       [] {
         R r = DensePerHead();
         SetFloat(*r.mutable_attention_logits(), LogitAt(0, 1, 2, 2), kNaN);
         return r;
       },
       "attention_logits"},
      {"PlusInfInLogitsAtMaskedPosition",
       [] {
         R r = DensePerHead();
         SetFloat(*r.mutable_attention_logits(), LogitAt(1, 0, 0, 3), kInf);
         return r;
       },
       "attention_logits"},
      {"NaNInWeights",
       [] {
         R r = DenseAggregated();
         SetFloat(*r.mutable_attention_weights(), ScoreAt(0, 3, 3), kNaN);
         return r;
       },
       "attention_weights"},
      {"PlusInfInWeights",
       [] {
         R r = DenseAggregated();
         SetFloat(*r.mutable_attention_weights(), ScoreAt(1, 2, 0), kInf);
         return r;
       },
       "attention_weights"},
      {"NegativeWeight",
       [] {
         R r = DenseAggregated();
         SetFloat(*r.mutable_attention_weights(), ScoreAt(1, 3, 1), -0.5f);
         return r;
       },
       "attention_weights"},
      {"NegativeWeightAtMaskedPosition",
       [] {
         R r = DenseAggregated();
         SetFloat(*r.mutable_attention_weights(), ScoreAt(0, 0, 3), -0.5f);
         return r;
       },
       "attention_weights"},
      {"NegativeInfWeight",
       [] {
         R r = DenseAggregated();
         SetFloat(*r.mutable_attention_weights(), ScoreAt(0, 2, 1), -kInf);
         return r;
       },
       "attention_weights"},
      {"NaNInScoresAtEmptySlot",
       [] {
         R r = Sparse();
         SetFloat(*r.mutable_indexer_scores(), 7, kNaN);  // row 1, slot 3
         return r;
       },
       "indexer_scores"},
      {"AllNegInfScoresInAValidRow",
       [] {
         R r = DensePerHead();
         for (int64_t s = 0; s < kS; ++s) {
           SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 2, s), -kInf);
         }
         return r;
       },
       "indexer_scores"},
      {"NegInfScoresAtEveryValidKeyOnly",
       [] {
         R r = DensePerHead();
         // Row (0, 1) sees keys 0 and 1; key 2 and 3 stay finite.
         for (int64_t s : {0, 1}) {
           SetFloat(*r.mutable_indexer_scores(), ScoreAt(0, 1, s), -kInf);
         }
         return r;
       },
       "indexer_scores"},
      {"AllNegInfLogitsForOneHead",
       [] {
         R r = DensePerHead();
         for (int64_t s = 0; s < kS; ++s) {
           SetFloat(*r.mutable_attention_logits(), LogitAt(1, 1, 3, s), -kInf);
         }
         return r;
       },
       "attention_logits"},
      {"ExactNegInfScoreWhereTargetIsPositive",
       [] {
         R r = DenseAggregated();
         SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 3, 2), -kInf);
         return r;
       },
       "indexer_scores"},
      // Which tensors are given.
      {"BothTargets",
       [] {
         R r = DensePerHead();
         *r.mutable_attention_weights() = DenseAggregated().attention_weights();
         return r;
       },
       "attention_logits"},
      {"NeitherTarget",
       [] {
         R r = DensePerHead();
         r.clear_attention_logits();
         return r;
       },
       "attention_logits"},
      {"SegmentIdsQAlone",
       [] {
         R r = DensePerHead();
         AddSegments(r);
         r.clear_segment_ids_kv();
         return r;
       },
       "segment_ids_kv"},
      {"SegmentIdsKvAlone",
       [] {
         R r = DensePerHead();
         AddSegments(r);
         r.clear_segment_ids_q();
         return r;
       },
       "segment_ids_q"},
      // Options.
      {"SoftmaxScaleZero",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_softmax_scale(0.0f);
         return r;
       },
       "softmax_scale"},
      {"SoftmaxScaleNegative",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_softmax_scale(-1.0f);
         return r;
       },
       "softmax_scale"},
      {"SoftmaxScaleNaN",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_softmax_scale(kNaN);
         return r;
       },
       "softmax_scale"},
      {"SoftmaxScaleInf",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_softmax_scale(kInf);
         return r;
       },
       "softmax_scale"},
      {"ScalingFactorNaN",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_scaling_factor(std::nan(""));
         return r;
       },
       "scaling_factor"},
      {"ScalingFactorInf",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_scaling_factor(-HUGE_VAL);
         return r;
       },
       "scaling_factor"},
      {"RecallKNegative",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_recall_k(-1);
         return r;
       },
       "recall_k"},
      {"GradDtypeInt32",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_grad_dtype("INT32");
         return r;
       },
       "grad_dtype: must be one of FP32, BF16, FP16, got"},
      {"GradDtypeBool",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_grad_dtype("BOOL");
         return r;
       },
       "grad_dtype: must be one of FP32, BF16, FP16, got"},
      {"GradDtypeUnknown",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_grad_dtype("FP64");
         return r;
       },
       "grad_dtype: must be one of FP32, BF16, FP16, got"},
      {"QOffsetOutOfRange",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_q_offset(std::numeric_limits<int64_t>::max());
         return r;
       },
       "q_offset"},
      {"UnknownFlavor",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_flavor(static_cast<v1::Flavor>(7));
         return r;
       },
       "options.flavor", absl::StatusCode::kInvalidArgument, false},
      {"UnknownReduction",
       [] {
         R r = DensePerHead();
         r.mutable_options()->set_reduction(static_cast<v1::Reduction>(9));
         return r;
       },
       "options.reduction", absl::StatusCode::kInvalidArgument, false},
  };
  return cases;
}

// Checks the good request after a bad one.
void ExpectStillServesGoodRequests(Client& client) {
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client.ComputeLossUnary(GoodRequest());
  ASSERT_TRUE(unary.ok()) << "good request after a bad one: "
                          << Describe(unary.status());
  EXPECT_TRUE(SameResponse(GoodResponse(), *unary));
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client.ComputeLossStreaming(GoodRequest(), 3);
  ASSERT_TRUE(streamed.ok())
      << "good stream after a bad one: " << Describe(streamed.status());
  EXPECT_TRUE(SameResponse(GoodResponse(), *streamed));
}

::testing::AssertionResult IsError(const absl::Status& status,
                                   absl::StatusCode code,
                                   const std::string& field) {
  if (status.code() == code && absl::StartsWith(status.message(), field)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "want " << absl::StatusCodeToString(code) << " starting with \""
         << field << "\", got " << Describe(status);
}

::testing::AssertionResult IsError(const grpc::Status& status,
                                   absl::StatusCode code,
                                   const std::string& field) {
  return IsError(
      absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message()),
      code, field);
}

class BadRequestTest : public ServerTest,
                       public ::testing::WithParamInterface<BadCase> {};

TEST_P(BadRequestTest, RejectedNamingTheFieldAndServerStillServes) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const BadCase& c = GetParam();
  const v1::ComputeLossRequest request = c.make();
  // The library itself refuses it (the bad request really is bad).
  if (c.library_rejects) {
    EXPECT_FALSE(LibraryCompute(request).ok());
  }

  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  EXPECT_TRUE(IsError(unary.status(), c.code, c.field)) << "unary";
  ExpectStillServesGoodRequests(client());

  // Streamed a row at a time, a value error sits in a later block; shape
  // errors are caught by the client's slicer or by the server's header
  // check, either way naming the field.
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request, 1);
  EXPECT_TRUE(IsError(streamed.status(), c.code, c.field)) << "streamed";
  ExpectStillServesGoodRequests(client());
}

INSTANTIATE_TEST_SUITE_P(Rules, BadRequestTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

// The MAXTEXT flavour stays finite where EXACT refuses a -inf score at a
// key with positive target mass: the same request is computed, and agrees
// with the library.
TEST_F(ServerTest, MaxTextComputesNegInfScoreWhereTargetIsPositive) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::ComputeLossRequest r = DenseAggregated();
  SetFloat(*r.mutable_indexer_scores(), ScoreAt(1, 3, 2), -kInf);
  r.mutable_options()->set_flavor(v1::FLAVOR_MAXTEXT);
  r.mutable_options()->set_want_row_kl(true);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(r);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(std::isfinite(expected->result().loss()));
  absl::StatusOr<v1::ComputeLossResponse> unary = client().ComputeLossUnary(r);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  EXPECT_TRUE(SameResponse(*expected, *unary));
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(r, 3);
  ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
  EXPECT_TRUE(SameResponse(*expected, *streamed));
}

// An index outside [0, num_keys), -1 or not, leaves its slot empty: the
// answer is the one with -1 there, unary and streamed.
TEST_F(ServerTest, TopkIndexOutsideTheKeysIsAnEmptySlot) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::ComputeLossRequest with_minus_one = Sparse();
  with_minus_one.mutable_options()->set_want_row_kl(true);
  v1::ComputeLossRequest outside = with_minus_one;
  // Rows 0, 5, 9, -1 / 2, 3, 4, -1 / 7, 1, 8, -1 become 0, 5, x, x /
  // 2, x, x, x / 7, 1, 8, x, with x -1 or another index outside [0, 10).
  for (const auto& [index, value] :
       {std::pair{2, 10}, std::pair{5, -5}, std::pair{6, 10}}) {
    SetTopk(with_minus_one, index, -1);
    SetTopk(outside, index, value);
  }
  SetTopk(outside, 3, std::numeric_limits<int32_t>::min());
  SetTopk(outside, 7, -2);
  SetTopk(outside, 11, std::numeric_limits<int32_t>::max());
  absl::StatusOr<v1::ComputeLossResponse> expected =
      client().ComputeLossUnary(with_minus_one);
  ASSERT_TRUE(expected.ok()) << Describe(expected.status());
  EXPECT_GT(expected->result().loss(), 0);
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(outside);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  EXPECT_TRUE(SameResponse(*expected, *unary));
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(outside, 1);
  ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
  EXPECT_TRUE(SameResponse(*expected, *streamed));
}

// ---------------------------------------------------------------------------
// The stream protocol, with raw stubs.

class StreamProtocolTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer());
    stub_ = MakeStub(server().target());
  }

  // The good request's header and its blocks of `rows` rows.
  static v1::ComputeLossStreamRequest Header(const v1::ComputeLossRequest& r) {
    absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(r);
    EXPECT_TRUE(slicer.ok()) << slicer.status();
    v1::ComputeLossStreamRequest m;
    *m.mutable_header() = slicer->MakeHeader();
    return m;
  }
  static v1::ComputeLossStreamRequest Block(const v1::ComputeLossRequest& r,
                                            int64_t begin, int64_t rows) {
    absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(r);
    EXPECT_TRUE(slicer.ok()) << slicer.status();
    v1::ComputeLossStreamRequest m;
    slicer->FillBlock(begin, rows, m.mutable_block());
    return m;
  }
  // Header, then blocks of 2 rows.
  static std::vector<v1::ComputeLossStreamRequest> WholeStream(
      const v1::ComputeLossRequest& r) {
    std::vector<v1::ComputeLossStreamRequest> messages = {Header(r)};
    const int64_t rows =
        r.indexer_scores().shape(0) * r.indexer_scores().shape(1);
    for (int64_t begin = 0; begin < rows; begin += 2) {
      messages.push_back(Block(r, begin, std::min<int64_t>(2, rows - begin)));
    }
    return messages;
  }

  void ExpectFails(const std::vector<v1::ComputeLossStreamRequest>& messages,
                   const std::string& field) {
    StreamOutcome outcome = RunStream(*stub_, messages);
    EXPECT_TRUE(
        IsError(outcome.status, absl::StatusCode::kInvalidArgument, field));
    ExpectStillServesGoodRequests(client());
  }

  std::unique_ptr<v1::IndexerKl::Stub> stub_;
};

TEST_F(StreamProtocolTest, RawWholeStreamAgreesWithTheLibrary) {
  // The raw helpers themselves are right: the unbroken stream succeeds.
  StreamOutcome outcome = RunStream(*stub_, WholeStream(GoodRequest()));
  ASSERT_TRUE(outcome.status.ok()) << Describe(outcome.status);
  ASSERT_FALSE(outcome.responses.empty());
  ASSERT_TRUE(outcome.responses.back().has_result());
  v1::ComputeLossResponse expected = GoodResponse();
  expected.clear_grad();
  expected.clear_row_kl();
  EXPECT_TRUE(SameResponse(expected, outcome.responses.back().result()));
  EXPECT_EQ(outcome.responses.size(), 1 + (2 * 5 + 1) / 2);
}

TEST_F(StreamProtocolTest, FirstMessageNotAHeader) {
  ExpectFails({Block(GoodRequest(), 0, 2)}, "header");
}

TEST_F(StreamProtocolTest, EmptyStream) { ExpectFails({}, "header"); }

TEST_F(StreamProtocolTest, SecondHeader) {
  ExpectFails({Header(GoodRequest()), Header(GoodRequest())}, "header");
}

TEST_F(StreamProtocolTest, EmptyMessageAfterTheHeader) {
  ExpectFails({Header(GoodRequest()), v1::ComputeLossStreamRequest()}, "block");
}

TEST_F(StreamProtocolTest, FirstBlockNotAtRowZero) {
  ExpectFails({Header(GoodRequest()), Block(GoodRequest(), 1, 2)}, "row_begin");
}

TEST_F(StreamProtocolTest, BlocksOutOfOrder) {
  ExpectFails({Header(GoodRequest()), Block(GoodRequest(), 0, 2),
               Block(GoodRequest(), 4, 2), Block(GoodRequest(), 2, 2)},
              "row_begin");
}

TEST_F(StreamProtocolTest, BlockRepeated) {
  ExpectFails({Header(GoodRequest()), Block(GoodRequest(), 0, 2),
               Block(GoodRequest(), 0, 2)},
              "row_begin");
}

TEST_F(StreamProtocolTest, ZeroRowBlock) {
  v1::ComputeLossStreamRequest block = Block(GoodRequest(), 0, 1);
  block.mutable_block()->set_num_rows(0);
  ExpectFails({Header(GoodRequest()), block}, "num_rows");
}

TEST_F(StreamProtocolTest, BlockPastTheLastRow) {
  v1::ComputeLossStreamRequest block = Block(GoodRequest(), 8, 2);
  block.mutable_block()->set_num_rows(3);  // rows 8..10 of 10
  std::vector<v1::ComputeLossStreamRequest> messages =
      WholeStream(GoodRequest());
  messages.back() = block;
  ExpectFails(messages, "num_rows");
}

TEST_F(StreamProtocolTest, WrongBlockByteSize) {
  v1::ComputeLossStreamRequest block = Block(GoodRequest(), 2, 2);
  block.mutable_block()->mutable_indexer_scores()->resize(2 * 9 * 4 - 4);
  ExpectFails({Header(GoodRequest()), Block(GoodRequest(), 0, 2), block},
              "indexer_scores");
}

TEST_F(StreamProtocolTest, WrongBlockLogitsByteSize) {
  v1::ComputeLossStreamRequest block = Block(GoodRequest(), 0, 3);
  block.mutable_block()->mutable_attention_logits()->append("ab");
  ExpectFails({Header(GoodRequest()), block}, "attention_logits");
}

TEST_F(StreamProtocolTest, BlockCarriesATensorTheProblemDoesNotUse) {
  v1::ComputeLossStreamRequest block = Block(GoodRequest(), 0, 2);
  block.mutable_block()->set_topk_indices(std::string(2 * 9 * 4, '\0'));
  ExpectFails({Header(GoodRequest()), block}, "topk_indices");
}

TEST_F(StreamProtocolTest, MissingBlocksAtTheEnd) {
  std::vector<v1::ComputeLossStreamRequest> messages =
      WholeStream(GoodRequest());
  messages.pop_back();
  ExpectFails(messages, "row_begin");
}

TEST_F(StreamProtocolTest, HeaderWithoutBlocks) {
  ExpectFails({Header(GoodRequest())}, "row_begin");
}

// MEAN_VALID without row_valid sends its rows twice, counting first; every
// other problem once, not counting. A block of the other pass names
// `counting`.
TEST_F(StreamProtocolTest, MeanValidWithoutRowValidSentOnceIsRefused) {
  v1::ComputeLossRequest r = GoodRequest();
  r.mutable_options()->set_reduction(v1::REDUCTION_MEAN_VALID);
  ExpectFails(WholeStream(r), "counting");
}

TEST_F(StreamProtocolTest, GradientBlockBeforeTheCountingPassEnds) {
  v1::ComputeLossRequest r = GoodRequest();
  r.mutable_options()->set_reduction(v1::REDUCTION_MEAN_VALID);
  v1::ComputeLossStreamRequest counted = Block(r, 0, 4);
  counted.mutable_block()->set_counting(true);
  ExpectFails({Header(r), counted, Block(r, 4, 6)}, "counting");
}

TEST_F(StreamProtocolTest, CountingBlockWhenNIsKnown) {
  std::vector<v1::ComputeLossStreamRequest> messages =
      WholeStream(GoodRequest());
  messages[2].mutable_block()->set_counting(true);
  ExpectFails(messages, "counting");
}

TEST_F(StreamProtocolTest, CountingPassWithoutTheGradientPass) {
  v1::ComputeLossRequest r = GoodRequest();
  r.mutable_options()->set_reduction(v1::REDUCTION_MEAN_VALID);
  std::vector<v1::ComputeLossStreamRequest> messages = WholeStream(r);
  for (size_t i = 1; i < messages.size(); ++i) {
    messages[i].mutable_block()->set_counting(true);
  }
  ExpectFails(messages, "row_begin");
}

// N comes from the counting pass and scales the gradient pass: passes that
// carry other rows (a client changing its arrays mid-stream) would give a
// wrong answer, so the result is refused instead.
TEST_F(StreamProtocolTest, PassesCarryingOtherRowsAreRefused) {
  ProblemSpec spec;
  spec.name = "passes";
  spec.B = 2, spec.T = 5, spec.S = 8, spec.H = 0;
  spec.options.set_reduction(v1::REDUCTION_MEAN_VALID);
  const v1::ComputeLossRequest counted = MakeRequest(spec);
  v1::ComputeLossRequest changed = counted;
  // Row 0's target is all zero the second time: one positive row fewer.
  for (int64_t j = 0; j < spec.S; ++j) {
    SetFloat(*changed.mutable_attention_weights(), j, 0.0f);
  }
  std::vector<v1::ComputeLossStreamRequest> messages = {Header(counted)};
  for (int64_t begin = 0; begin < 10; begin += 5) {
    messages.push_back(Block(counted, begin, 5));
    messages.back().mutable_block()->set_counting(true);
  }
  for (int64_t begin = 0; begin < 10; begin += 5) {
    messages.push_back(Block(changed, begin, 5));
  }
  ExpectFails(messages, "counting");
  // The same passes twice are answered.
  for (size_t i = 3; i < messages.size(); ++i) {
    messages[i] = Block(counted, 5 * static_cast<int64_t>(i - 3), 5);
  }
  StreamOutcome outcome = RunStream(*stub_, messages);
  EXPECT_TRUE(outcome.status.ok()) << Describe(outcome.status);
}

TEST_F(StreamProtocolTest, HeaderSpecBadDtype) {
  v1::ComputeLossStreamRequest header = Header(GoodRequest());
  header.mutable_header()->mutable_indexer_scores()->set_dtype("F32");
  std::vector<v1::ComputeLossStreamRequest> messages =
      WholeStream(GoodRequest());
  messages[0] = header;
  ExpectFails(messages, "indexer_scores");
}

TEST_F(StreamProtocolTest, HeaderSpecZeroDim) {
  v1::ComputeLossStreamRequest header = Header(GoodRequest());
  header.mutable_header()->mutable_attention_logits()->set_shape(1, 0);
  ExpectFails({header}, "attention_logits");
}

TEST_F(StreamProtocolTest, HeaderSmallTensorByteSizeMismatch) {
  v1::ComputeLossStreamRequest header = Header(GoodRequest());
  header.mutable_header()->mutable_segment_ids_kv()->mutable_data()->resize(5);
  ExpectFails({header}, "segment_ids_kv");
}

TEST_F(StreamProtocolTest, ValueErrorInALaterBlock) {
  v1::ComputeLossRequest r = GoodRequest();
  SetFloat(*r.mutable_indexer_scores(), 7 * 9 + 4, kNaN);  // row 7
  StreamOutcome outcome = RunStream(*stub_, WholeStream(r));
  EXPECT_TRUE(IsError(outcome.status, absl::StatusCode::kInvalidArgument,
                      "indexer_scores"));
  for (const auto& response : outcome.responses) {
    EXPECT_FALSE(response.has_result()) << "a result after a value error";
  }
  ExpectStillServesGoodRequests(client());
}

// ---------------------------------------------------------------------------
// --max_tensor_bytes: RESOURCE_EXHAUSTED naming the tensor.

class TensorLimitTest : public ServerTest {
 protected:
  static constexpr int64_t kLimit = 64 << 10;
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartServer({absl::StrCat("--max_tensor_bytes=", kLimit)}));
  }
  // Dense head-aggregated [1, rows, 512] inputs.
  static v1::ComputeLossRequest Problem(int64_t rows, const std::string& dtype,
                                        const std::string& grad_dtype) {
    ProblemSpec s;
    s.name = "limit";
    s.B = 1, s.T = rows, s.S = 512, s.H = 0;
    s.target_dtype = s.scores_dtype = dtype;
    s.options.set_grad_dtype(grad_dtype);
    s.seed = 5;
    return MakeRequest(s);
  }
};

TEST_F(TensorLimitTest, GradientOverTheLimit) {
  // Inputs of 40 KiB each; an FP32 gradient of 80 KiB.
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(Problem(40, "BF16", "FP32"));
  EXPECT_TRUE(
      IsError(unary.status(), absl::StatusCode::kResourceExhausted, "grad"));
  // In blocks under the limit the same problem goes through.
  const v1::ComputeLossRequest request = Problem(40, "BF16", "FP32");
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request, 8);
  ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
  EXPECT_TRUE(SameResponse(*expected, *streamed));
  ExpectStillServesGoodRequests(client());
}

TEST_F(TensorLimitTest, StreamBlockOverTheLimit) {
  // One block of 40 rows carries 80 KiB of FP32 scores.
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(Problem(40, "FP32", "BF16"), 40);
  EXPECT_TRUE(IsError(streamed.status(), absl::StatusCode::kResourceExhausted,
                      "attention_weights"));
  ExpectStillServesGoodRequests(client());
}

// The flag and GetServerInfo say the limit is on the largest tensor a
// request "may carry or ask for"; here an input tensor of 80 KiB comes in one
// unary message, without a gradient.
TEST_F(TensorLimitTest, UnaryInputTensorOverTheLimit) {
  v1::ComputeLossRequest request = Problem(40, "FP32", "FP32");
  request.mutable_options()->set_skip_grad(true);
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  EXPECT_TRUE(IsError(unary.status(), absl::StatusCode::kResourceExhausted,
                      "attention_weights"))
      << "(a unary request's input tensors are not checked against "
         "--max_tensor_bytes, only its gradient)";
  ExpectStillServesGoodRequests(client());
}

}  // namespace
}  // namespace klserve::integration
