// The server's numbers are the library's numbers: for random problems of
// every input form and reduction (MEAN_VALID without row_valid, which the
// stream counts in a first pass, included), unary and streamed (any block
// size) responses equal, bit for bit, what IndexerKlProblem::Create +
// ComputeIndexerKl give in-process. Also: a problem over the server's message
// limit streams, and concurrent clients get independent, correct results.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/isa.h"
#include "tests/integration/harness.h"

namespace klserve::integration {
namespace {

v1::LossOptions Options(v1::Flavor flavor, v1::Reduction reduction,
                        const std::string& grad_dtype) {
  v1::LossOptions o;
  o.set_flavor(flavor);
  o.set_reduction(reduction);
  o.set_grad_dtype(grad_dtype);
  return o;
}

std::vector<ProblemSpec> AgreementSpecs() {
  std::vector<ProblemSpec> specs;
  {
    ProblemSpec s;
    s.name = "DensePerHeadFp32Causal";
    s.B = 2, s.T = 5, s.S = 11, s.H = 3;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(4);
    s.seed = 11;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "DensePerHeadBf16MaxTextSum";
    s.B = 2, s.T = 7, s.S = 9, s.H = 2;
    s.target_dtype = s.scores_dtype = "BF16";
    s.attention_mask = true;
    s.neg_inf_at_masked = true;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_SUM, "BF16");
    s.options.set_softmax_scale(0.125f);
    s.options.set_scaling_factor(0.01);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.seed = 12;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "DenseAggregatedFp16MeanValid";
    s.B = 3, s.T = 4, s.S = 13, s.H = 0;
    s.target_dtype = s.scores_dtype = "FP16";
    s.row_valid = true;
    s.key_padding = true;
    s.zero_target_rows = true;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN_VALID, "FP16");
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(2);
    s.seed = 13;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparsePerHeadSegmentsMasks";
    s.B = 2, s.T = 6, s.S = 40, s.K = 8, s.H = 2;
    s.target_dtype = "FP32";
    s.scores_dtype = "BF16";
    s.segments = true;
    s.attention_mask = true;
    s.neg_inf_at_masked = true;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(3);
    s.seed = 14;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparseAggregatedMaxTextMeanValid";
    s.B = 1, s.T = 9, s.S = 30, s.K = 5, s.H = 0;
    s.target_dtype = "BF16";
    s.scores_dtype = "FP32";
    s.row_valid = true;
    s.key_padding = true;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "FP16");
    s.options.set_want_row_kl(true);
    s.options.set_scaling_factor(0.5);
    s.seed = 15;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "DenseMeanValidRowValidAttentionMask";
    s.B = 3, s.T = 5, s.S = 12, s.H = 2;
    s.target_dtype = "FP16";
    s.scores_dtype = "BF16";
    s.segments = true;
    s.attention_mask = true;
    s.row_valid = true;
    s.neg_inf_at_masked = true;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "FP16");
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(4);
    s.options.set_scaling_factor(0.01);
    s.seed = 22;
    specs.push_back(s);
  }
  {
    // grad_scale multiplies the gradient and leaves the loss alone.
    ProblemSpec s;
    s.name = "SparseGradScaleBf16";
    s.B = 2, s.T = 6, s.S = 20, s.H = 0, s.K = 5;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "BF16");
    s.options.set_scaling_factor(0.01);
    s.options.set_grad_scale(-3.5);
    s.options.set_want_row_kl(true);
    s.seed = 31;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SkipGradZeroScaling";
    s.B = 2, s.T = 3, s.S = 7, s.H = 2;
    s.target_dtype = "FP16";
    s.scores_dtype = "FP32";
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_SUM, "");
    s.options.set_skip_grad(true);
    s.options.set_scaling_factor(0.0);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.seed = 16;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "MixedDtypesSegmentsPaddingRowValid";
    s.B = 2, s.T = 6, s.S = 10, s.H = 3;
    s.target_dtype = "FP16";
    s.scores_dtype = "BF16";
    s.segments = true;
    s.key_padding = true;
    s.row_valid = true;
    s.options =
        Options(v1::FLAVOR_UNSPECIFIED, v1::REDUCTION_UNSPECIFIED, "BF16");
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(5);
    s.seed = 17;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "QOffsetFullyMaskedRows";
    s.B = 2, s.T = 5, s.S = 12, s.H = 4;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_q_offset(-2);  // rows 0 and 1 see no key
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(7);
    s.seed = 18;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SingleKeySingleRow";
    s.B = 1, s.T = 1, s.S = 1, s.H = 0;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(1);
    s.seed = 19;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "LargerPerHeadBf16Causal";
    s.B = 2, s.T = 33, s.S = 257, s.H = 2;
    s.target_dtype = s.scores_dtype = "BF16";
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(16);
    s.seed = 20;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparseAllSlotsFullK";
    s.B = 3, s.T = 4, s.S = 6, s.K = 6, s.H = 3;
    s.empty_slots = false;
    s.target_dtype = "BF16";
    s.scores_dtype = "FP16";
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_SUM, "BF16");
    s.options.set_want_row_kl(true);
    s.seed = 21;
    specs.push_back(s);
  }
  // MEAN_VALID without row_valid, in every form and grad dtype: N is
  // counted in a first pass, over the stream too.
  {
    ProblemSpec s;
    s.name = "DensePerHeadMeanValidCounted";
    s.B = 2, s.T = 5, s.S = 9, s.H = 2;
    s.target_dtype = "BF16";
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN_VALID, "FP32");
    s.options.set_causal(true);
    s.options.set_q_offset(-1);  // row 0 of each batch is fully masked
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.seed = 23;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "DenseAggregatedMeanValidCounted";
    s.B = 3, s.T = 4, s.S = 10, s.H = 0;
    s.zero_target_rows = true;
    s.segments = true;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "BF16");
    s.options.set_want_row_kl(true);
    s.options.set_scaling_factor(0.01);
    s.seed = 24;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparsePerHeadMeanValidCounted";
    s.B = 2, s.T = 6, s.S = 30, s.K = 6, s.H = 3;
    s.scores_dtype = "FP16";
    s.attention_mask = true;
    s.neg_inf_at_masked = true;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN_VALID, "FP16");
    s.options.set_want_row_kl(true);
    s.options.set_want_diagnostics(true);
    s.options.set_recall_k(2);
    s.seed = 25;
    specs.push_back(s);
  }
  {
    ProblemSpec s;
    s.name = "SparseAggregatedMeanValidCounted";
    s.B = 1, s.T = 11, s.S = 20, s.K = 4, s.H = 0;
    s.zero_target_rows = true;
    s.key_padding = true;
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "FP32");
    s.options.set_causal(true);
    s.options.set_want_row_kl(true);
    s.seed = 26;
    specs.push_back(s);
  }
  return specs;
}

// Streamed problems with segment ids or a key padding mask and no
// attention_mask: an unused block tensor must stay absent (an empty string's
// data() once made it look present and be read as the mask).
class LossAgreementTest : public ServerTest,
                          public ::testing::WithParamInterface<ProblemSpec> {};

TEST_P(LossAgreementTest, UnaryAndStreamingEqualTheLibraryBitForBit) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const ProblemSpec& spec = GetParam();
  const v1::ComputeLossRequest request = MakeRequest(spec);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok())
      << "the library rejects the generated problem: " << expected.status();
  // The generator makes problems where the masks matter.
  if (spec.options.want_row_kl()) {
    ASSERT_EQ(expected->row_kl().data().size(),
              static_cast<size_t>(spec.B * spec.T * 8));
  }

  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  EXPECT_TRUE(SameResponse(*expected, *unary)) << "unary";

  const int64_t rows = spec.B * spec.T;
  // 1 row; odd sizes (crossing batch boundaries when B > 1); T + 1; all
  // rows in one block; and the client's own choice (0).
  std::vector<int64_t> block_rows = {1, 2, 3, 7, spec.T + 1, rows - 1, rows, 0};
  block_rows.erase(std::remove_if(block_rows.begin(), block_rows.end(),
                                  [&](int64_t n) { return n < 0 || n > rows; }),
                   block_rows.end());
  std::sort(block_rows.begin(), block_rows.end());
  block_rows.erase(std::unique(block_rows.begin(), block_rows.end()),
                   block_rows.end());
  for (int64_t n : block_rows) {
    SCOPED_TRACE(absl::StrCat("streamed in blocks of ", n, " rows"));
    absl::StatusOr<v1::ComputeLossResponse> streamed =
        client().ComputeLossStreaming(request, n);
    ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
    EXPECT_TRUE(SameResponse(*expected, *streamed));
  }
}

INSTANTIATE_TEST_SUITE_P(Problems, LossAgreementTest,
                         ::testing::ValuesIn(AgreementSpecs()),
                         [](const ::testing::TestParamInfo<ProblemSpec>& info) {
                           return info.param.name;
                         });

// MEAN_VALID without row_valid: N is only known after a pass over the rows.
// The stream sends the rows twice, the counting pass first; its blocks may
// be cut unlike the gradient pass's, and are answered without tensors.
TEST_F(ServerTest, MeanValidWithoutRowValidCountingPassMayUseOtherBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ProblemSpec s;
  s.name = "MeanValidNoRowValid";
  s.B = 2, s.T = 6, s.S = 8, s.H = 0;
  s.zero_target_rows = true;
  s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN_VALID, "BF16");
  s.options.set_causal(true);
  s.options.set_q_offset(-1);  // row 0 of each batch is fully masked
  s.options.set_want_row_kl(true);
  s.options.set_want_diagnostics(true);
  s.seed = 31;
  const v1::ComputeLossRequest request = MakeRequest(s);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_LT(expected->result().denominator(), s.B * s.T);

  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  EXPECT_TRUE(SameResponse(*expected, *unary));

  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  ASSERT_TRUE(slicer->counts_first());
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub(server().target());
  const int64_t rows = s.B * s.T;
  // (counting blocks, gradient blocks): one row against all rows, odd sizes
  // crossing the batch boundary, and the reverse.
  for (const auto& [count_rows, grad_rows] :
       {std::pair<int64_t, int64_t>{1, rows}, {rows, 1}, {5, 2}, {2, 7}}) {
    SCOPED_TRACE(absl::StrCat("counting blocks of ", count_rows,
                              ", gradient blocks of ", grad_rows));
    std::vector<v1::ComputeLossStreamRequest> messages = {
        HeaderMessage(*slicer)};
    for (const auto& [counting, n] :
         {std::pair{true, count_rows}, std::pair{false, grad_rows}}) {
      for (int64_t row = 0; row < rows; row += n) {
        messages.push_back(
            BlockMessage(*slicer, row, std::min(n, rows - row), counting));
      }
    }
    StreamOutcome outcome = RunStream(*stub, messages);
    ASSERT_TRUE(outcome.status.ok()) << Describe(outcome.status);
    ASSERT_EQ(outcome.responses.size(), messages.size());
    ResponseAssembler assembler(request.indexer_scores().shape(),
                                /*counting_pass=*/true);
    for (size_t i = 0; i + 1 < outcome.responses.size(); ++i) {
      v1::ComputeLossStreamResponse& response = outcome.responses[i];
      ASSERT_TRUE(response.has_grad_block()) << i;
      const bool counting = messages[i + 1].block().counting();
      EXPECT_EQ(response.grad_block().has_grad(), !counting) << i;
      EXPECT_EQ(response.grad_block().has_row_kl(), !counting) << i;
      ASSERT_TRUE(assembler.Add(*response.mutable_grad_block()).ok()) << i;
    }
    ASSERT_TRUE(outcome.responses.back().has_result());
    absl::StatusOr<v1::ComputeLossResponse> streamed =
        assembler.Finish(outcome.responses.back().result());
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_TRUE(SameResponse(*expected, *streamed));
  }
}

// A client that streams on its own (every problem over its threshold of 0
// bytes) sends a MEAN_VALID problem without row_valid twice, counting first,
// and gets the unary answer.
TEST_F(ServerTest, AutoStreamingCountsMeanValidWithoutRowValid) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ProblemSpec s;
  s.name = "AutoStreamedMeanValid";
  s.B = 2, s.T = 40, s.S = 24, s.H = 2;
  s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "FP16");
  s.options.set_causal(true);
  s.options.set_q_offset(-3);  // three rows of each batch fully masked
  s.options.set_want_row_kl(true);
  s.seed = 32;
  const v1::ComputeLossRequest request = MakeRequest(s);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->result().denominator(), s.B * (s.T - 3));

  ClientOptions options;
  options.target = server().target();
  options.deadline = kCallDeadline;
  options.max_attempts = 1;
  options.stream_threshold_bytes = 0;
  options.block_bytes = 4096;  // several blocks
  absl::StatusOr<std::unique_ptr<Client>> streaming = Client::Create(options);
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  absl::StatusOr<v1::ComputeLossResponse> auto_response =
      (*streaming)->ComputeLoss(request);
  ASSERT_TRUE(auto_response.ok()) << Describe(auto_response.status());
  EXPECT_TRUE(SameResponse(*expected, *auto_response));
}

// An ~8 MiB problem against a server that takes 1 MiB messages: the unary
// call is refused for its size; ComputeLoss (auto) streams it, in blocks
// under the limit, and gets the library's numbers.
TEST_F(ServerTest, ProblemOverTheMessageLimitGoesThroughTheStream) {
  constexpr int64_t kLimit = 1 << 20;
  ASSERT_NO_FATAL_FAILURE(
      StartServer({absl::StrCat("--max_message_bytes=", kLimit)}));
  absl::StatusOr<v1::GetServerInfoResponse> info = client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << Describe(info.status());
  EXPECT_EQ(info->max_message_bytes(), kLimit);

  ProblemSpec s;
  s.name = "EightMiB";
  s.B = 2, s.T = 256, s.S = 2048, s.H = 0;  // 2 x 4 MiB of FP32
  s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
  s.options.set_causal(true);
  s.options.set_want_row_kl(true);
  s.options.set_want_diagnostics(true);
  s.options.set_recall_k(64);
  s.seed = 41;
  const v1::ComputeLossRequest request = MakeRequest(s);
  ASSERT_GE(request.ByteSizeLong(), size_t{8} << 20);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();

  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_FALSE(unary.ok());
  EXPECT_EQ(unary.status().code(), absl::StatusCode::kResourceExhausted)
      << Describe(unary.status());

  // A request under the limit whose response is not: S = 1 and row_kl
  // make the response three times the request. The refusal names the
  // largest output, row_kl (8 bytes a row, the gradient 4).
  ProblemSpec tall;
  tall.name = "TallResponse";
  tall.B = 1, tall.T = 128 << 10, tall.S = 1, tall.H = 0;
  tall.target_dtype = tall.scores_dtype = "BF16";
  tall.options.set_want_row_kl(true);
  const v1::ComputeLossRequest tall_request = MakeRequest(tall);
  ASSERT_LT(tall_request.ByteSizeLong(), size_t{kLimit});
  absl::StatusOr<v1::ComputeLossResponse> tall_unary =
      client().ComputeLossUnary(tall_request);
  ASSERT_FALSE(tall_unary.ok());
  EXPECT_EQ(tall_unary.status().code(), absl::StatusCode::kResourceExhausted)
      << Describe(tall_unary.status());
  EXPECT_TRUE(absl::StartsWith(tall_unary.status().message(),
                               "row_kl: the response would carry at least " +
                                   std::to_string(12 * tall.T)))
      << Describe(tall_unary.status());

  ClientOptions options;
  options.target = server().target();
  options.deadline = kCallDeadline;
  options.max_attempts = 1;
  // Stream whatever the server could not take in one message, in blocks
  // well under its limit (the client does not ask the server its limit).
  options.stream_threshold_bytes = kLimit / 2;
  options.block_bytes = kLimit / 4;
  absl::StatusOr<std::unique_ptr<Client>> streaming = Client::Create(options);
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  absl::StatusOr<v1::ComputeLossResponse> auto_response =
      (*streaming)->ComputeLoss(request);
  ASSERT_TRUE(auto_response.ok()) << Describe(auto_response.status());
  EXPECT_TRUE(SameResponse(*expected, *auto_response));
}

// Six clients, each on its own connection, send different problems at once,
// unary and streamed; each gets its own problem's answer.
TEST_F(ServerTest, ConcurrentClientsGetIndependentCorrectResults) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  constexpr int kThreads = 6;
  constexpr int kPerThread = 4;
  struct Job {
    v1::ComputeLossRequest request;
    v1::ComputeLossResponse expected;
    bool stream = false;
    int64_t block_rows = 0;
  };
  std::vector<std::vector<Job>> jobs(kThreads);
  const char* dtypes[] = {"FP32", "BF16", "FP16"};
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      ProblemSpec s;
      s.name = absl::StrCat("thread", t, "_", i);
      s.B = 1 + (t + i) % 3;
      s.T = 5 + 3 * i + t;
      s.S = 24 + 8 * t + i;
      s.H = (t % 2 == 0) ? 1 + i % 3 : 0;
      s.K = (t % 3 == 2) ? 5 + i : 0;
      s.target_dtype = dtypes[(t + i) % 3];
      s.scores_dtype = dtypes[(t + 2 * i) % 3];
      s.segments = i % 2 == 1;
      s.key_padding = t % 2 == 1;
      s.row_valid = (t + i) % 2 == 0;
      s.options =
          Options(i % 2 ? v1::FLAVOR_MAXTEXT : v1::FLAVOR_EXACT,
                  s.row_valid ? v1::REDUCTION_MEAN_VALID : v1::REDUCTION_MEAN,
                  dtypes[(t + i + 1) % 3]);
      s.options.set_causal(s.K == 0 && t % 2 == 0);
      s.options.set_want_row_kl(true);
      s.options.set_want_diagnostics(true);
      s.options.set_recall_k(3);
      s.options.set_scaling_factor(0.01 * (t + 1));
      s.seed = 100 * t + i;
      Job job;
      job.request = MakeRequest(s);
      absl::StatusOr<v1::ComputeLossResponse> expected =
          LibraryCompute(job.request);
      ASSERT_TRUE(expected.ok()) << s.name << ": " << expected.status();
      job.expected = *std::move(expected);
      job.stream = (t + i) % 2 == 1;
      job.block_rows = 1 + (t * 7 + i) % 5;
      jobs[t].push_back(std::move(job));
    }
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Retries (UNAVAILABLE only): a connection attempt refused while
      // eight clients connect at once on a loaded machine is not what this
      // test is about (seen once under ASan, a connect failing with a
      // stray errno).
      std::unique_ptr<Client> client =
          MakeClient(server().target(), /*max_attempts=*/3);
      if (client == nullptr) return;
      for (const Job& job : jobs[t]) {
        SCOPED_TRACE(job.request.request_id());
        absl::StatusOr<v1::ComputeLossResponse> response =
            job.stream
                ? client->ComputeLossStreaming(job.request, job.block_rows)
                : client->ComputeLossUnary(job.request);
        if (!response.ok()) {
          ADD_FAILURE() << Describe(response.status());
          continue;
        }
        EXPECT_TRUE(SameResponse(job.expected, *response));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// A server forced onto each CPU kernels' variant this CPU runs says so and
// answers every agreement problem with the library's bits (the library runs
// the CPU's best variant); a variant this CPU cannot run, or an unknown
// word, stops the server at start with a message naming --isa.
TEST(IsaFlag, EveryVariantServesTheSameBits) {
  for (cpu::Isa isa :
       {cpu::Isa::kBaseline, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    const std::string name(cpu::IsaName(isa));
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start({"--isa=" + name});
    if (!cpu::CpuRuns(isa)) {
      ASSERT_FALSE(server.ok());
      EXPECT_TRUE(absl::StrContains(server.status().message(),
                                    "--isa=" + name + ": this CPU cannot run"))
          << server.status();
      continue;
    }
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_TRUE(absl::StrContains((*server)->Log(),
                                  "CPU kernels: " + name + " (--isa)"))
        << (*server)->Log();
    std::unique_ptr<Client> client = MakeClient((*server)->target());
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
    ASSERT_TRUE(info.ok()) << Describe(info.status());
    EXPECT_TRUE(absl::StrContains(info->device(), name + " kernels, OpenBLAS "))
        << info->device();
    for (const ProblemSpec& spec : AgreementSpecs()) {
      SCOPED_TRACE(spec.name);
      const v1::ComputeLossRequest request = MakeRequest(spec);
      absl::StatusOr<v1::ComputeLossResponse> expected =
          LibraryCompute(request);
      ASSERT_TRUE(expected.ok()) << expected.status();
      absl::StatusOr<v1::ComputeLossResponse> unary =
          client->ComputeLossUnary(request);
      ASSERT_TRUE(unary.ok()) << Describe(unary.status());
      EXPECT_TRUE(SameResponse(*expected, *unary));
    }
  }
}

TEST(IsaFlag, UnknownWordStopsTheServer) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--isa=sse9"});
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::StrContains(
      server.status().message(),
      "--isa: must be auto, avx512, avx2 or baseline, got \"sse9\""))
      << server.status();
}

}  // namespace
}  // namespace klserve::integration
