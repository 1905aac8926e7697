// The projections form over ComputeLossStream on the real server: the key
// side whole in the StreamHeader, the query side in RowBlocks of any size.
// Blocks that end inside a tile are answered by GradBlocks of the rows they
// completed, and the assembled answer equals the unary one bit for bit (the
// unary one equals the float64 reference: projections_test); the streamed
// one is also held against the reference here. The stream's refusals name
// their field: the key side past --max_stream_key_bytes, d_index_key past
// the message limit, MEAN_VALID that needs every row first, blocks out of
// order, a block missing a tensor or carrying one the header lacks.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/stream_codec.h"
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

// A spec and whether its request carries the reference's lse.
struct StreamCase {
  ProjectionsSpec spec;
  bool lse = false;
};

void PrintTo(const StreamCase& c, std::ostream* os) { *os << c.spec.name; }

// More rows than a dense tile (128) where the case is dense, so that blocks
// of 129 rows end inside a tile and blocks of 1 and 7 rows are held back.
std::vector<StreamCase> StreamCases() {
  std::vector<StreamCase> cases;
  {
    StreamCase c;
    ProjectionsSpec& s = c.spec;
    s.name = "DenseCausalGqa";
    s.B = 2, s.T = 140, s.S = 140, s.H = 2, s.H_kv = 1, s.D = 8;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_softmax_scale(0.35f);
    s.seed = 51;
    cases.push_back(c);
  }
  {
    StreamCase c;
    ProjectionsSpec& s = c.spec;
    s.name = "SparseClientIndices";
    s.B = 2, s.T = 40, s.S = 48, s.H = 2, s.H_kv = 2, s.D = 4, s.K = 8;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_SUM, "FP32");
    s.options.set_scaling_factor(0.5);
    s.options.set_grad_scale(2.0);
    s.seed = 52;
    cases.push_back(c);
  }
  {
    StreamCase c;
    ProjectionsSpec& s = c.spec;
    s.name = "ServerTopk";
    s.B = 1, s.T = 50, s.S = 50, s.H = 2, s.H_kv = 1, s.D = 4;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_topk(5);
    s.seed = 53;
    cases.push_back(c);
  }
  {
    StreamCase c;
    ProjectionsSpec& s = c.spec;
    s.name = "DenseWithLse";
    s.B = 1, s.T = 140, s.S = 100, s.H = 4, s.H_kv = 2, s.D = 8;
    s.options = Options(v1::FLAVOR_EXACT, v1::REDUCTION_MEAN, "FP32");
    s.options.set_causal(true);
    s.options.set_softmax_scale(0.25f);
    s.seed = 54;
    c.lse = true;
    cases.push_back(c);
  }
  {
    // MEAN_VALID without row_valid, dense without a mask: N is counted
    // without the rows, before the first block.
    StreamCase c;
    ProjectionsSpec& s = c.spec;
    s.name = "Bf16MaxTextMeanValid";
    s.B = 1, s.T = 130, s.S = 130, s.H = 2, s.H_kv = 2, s.D = 8;
    s.dtype = "BF16";
    s.options = Options(v1::FLAVOR_MAXTEXT, v1::REDUCTION_MEAN_VALID, "BF16");
    s.options.set_causal(true);
    s.seed = 55;
    cases.push_back(c);
  }
  return cases;
}

v1::ComputeLossRequest RequestOf(const StreamCase& c) {
  v1::ComputeLossRequest request = MakeProjectionsRequest(c.spec);
  if (c.lse) *request.mutable_lse() = LseOf(RefProjectionsOf(request));
  return request;
}

// The streamed answer against the reference, to the gradient dtype's
// tolerance.
void ExpectAsTheReference(const v1::ComputeLossRequest& request,
                          const v1::ComputeLossResponse& response) {
  const klref::RefProjectionsResult ref =
      klref::ComputeProjectionsReference(RefProjectionsOf(request));
  ASSERT_TRUE(ref.kl.error.empty()) << ref.kl.error;
  EXPECT_TRUE(CloseResult(ref.kl, response, 1e-5));
  const double tolerance = GradTolerance(request.options().grad_dtype());
  EXPECT_TRUE(
      CloseTensor(ref.d_index_query, response.d_index_query(), tolerance));
  EXPECT_TRUE(CloseTensor(ref.d_index_key, response.d_index_key(), tolerance));
  EXPECT_TRUE(
      CloseTensor(ref.d_index_weights, response.d_index_weights(), tolerance));
  if (request.options().topk() > 0) {
    EXPECT_EQ(DecodeInts(response.topk_indices()), ref.topk_indices);
  }
}

class ProjectionsStreamTest : public ServerTest,
                              public ::testing::WithParamInterface<StreamCase> {
};

TEST_P(ProjectionsStreamTest, StreamedEqualsUnaryInBlocksOfAnySize) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const v1::ComputeLossRequest request = RequestOf(GetParam());
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  const int64_t rows = GetParam().spec.B * GetParam().spec.T;
  for (const int64_t block_rows :
       {int64_t{1}, int64_t{7}, int64_t{129}, rows}) {
    SCOPED_TRACE(block_rows);
    absl::StatusOr<v1::ComputeLossResponse> streamed =
        client().ComputeLossStreaming(request, block_rows);
    ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
    EXPECT_TRUE(SameResponse(*unary, *streamed));
    if (block_rows == 7) ExpectAsTheReference(request, *streamed);
  }
}

INSTANTIATE_TEST_SUITE_P(Problems, ProjectionsStreamTest,
                         ::testing::ValuesIn(StreamCases()),
                         [](const ::testing::TestParamInfo<StreamCase>& info) {
                           return info.param.spec.name;
                         });

// Blocks of 7 rows against dense tiles of 128: the GradBlocks cover the
// rows each block completed, in order, some of them none.
TEST_F(ServerTest, ProjectionsGradBlocksCoverTheCompletedRows) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  StreamCase c = StreamCases()[0];
  const v1::ComputeLossRequest request = RequestOf(c);
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << Describe(slicer.status());
  std::vector<v1::ComputeLossStreamRequest> messages = {HeaderMessage(*slicer)};
  const int64_t rows = slicer->num_rows();
  for (int64_t r = 0; r < rows; r += 7) {
    messages.push_back(
        BlockMessage(*slicer, r, std::min<int64_t>(7, rows - r)));
  }
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub(server().target());
  const StreamOutcome outcome = RunStream(*stub, messages);
  ASSERT_TRUE(outcome.status.ok()) << Describe(outcome.status);
  // One answer per block, then the result.
  ASSERT_EQ(outcome.responses.size(), messages.size());
  int64_t next = 0;
  int empty = 0;
  for (size_t i = 0; i + 1 < outcome.responses.size(); ++i) {
    ASSERT_TRUE(outcome.responses[i].has_grad_block()) << i;
    const v1::GradBlock& block = outcome.responses[i].grad_block();
    EXPECT_EQ(block.row_begin(), next) << i;
    next += block.num_rows();
    if (block.num_rows() == 0) {
      ++empty;
      EXPECT_FALSE(block.has_d_index_query()) << i;
      continue;
    }
    // Whole tiles of one batch entry (T = 140: tiles [0, 128), [128, 140)).
    EXPECT_TRUE(next % 140 == 0 || next % 140 == 128) << i << ": " << next;
    EXPECT_EQ(block.d_index_query().shape(0), block.num_rows()) << i;
    EXPECT_EQ(block.d_index_weights().shape(0), block.num_rows()) << i;
    EXPECT_EQ(block.row_kl().shape(0), block.num_rows()) << i;
  }
  EXPECT_EQ(next, rows);
  EXPECT_GT(empty, 0);
  ASSERT_TRUE(outcome.responses.back().has_result());
  const v1::ComputeLossResponse& result = outcome.responses.back().result();
  EXPECT_TRUE(result.has_d_index_key());
  EXPECT_FALSE(result.has_d_index_query());
}

// Past the message limit: Client::ComputeLoss streams it past its
// threshold, and the answer is the reference's.
TEST_F(ServerTest, ProjectionsPastTheMessageLimitGoThroughTheStream) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=30000"}));
  ProjectionsSpec spec;
  spec.name = "PastTheMessageLimit";
  // A query row is (4 * 16 + 2 * 8 + 2) BF16: 164 bytes; its answer
  // (2 * 8 + 2) FP32: 72 bytes, 9216 for a tile of 128.
  spec.T = 256, spec.S = 64, spec.H = 4, spec.H_kv = 1, spec.D = 16;
  spec.H_I = 2, spec.D_I = 8;
  spec.dtype = "BF16";
  spec.options.set_grad_dtype("FP32");
  spec.options.set_causal(true);
  spec.seed = 58;
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  ASSERT_GT(request.ByteSizeLong(), 30000u);
  ClientOptions options;
  options.target = server().target();
  options.stream_threshold_bytes = 20000;
  options.block_bytes = 8192;
  absl::StatusOr<std::unique_ptr<Client>> streaming =
      Client::Create(std::move(options));
  ASSERT_TRUE(streaming.ok()) << Describe(streaming.status());
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      (*streaming)->ComputeLoss(request);
  ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
  ExpectAsTheReference(request, *streamed);
}

// A block's answer carries whole tiles (128 dense rows): a message limit
// that one tile's answer is over refuses the stream at its header, naming
// the largest output, whatever the blocks would be.
TEST_F(ServerTest, ProjectionsStreamRefusesATileOverTheMessageLimit) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=30000"}));
  ProjectionsSpec spec;
  spec.name = "TileLimit";
  // A tile's d_index_query: 128 * 8 * 16 FP32 = 65536 bytes.
  spec.T = 200, spec.S = 16, spec.H = 1, spec.H_kv = 1, spec.D = 1;
  spec.H_I = 8, spec.D_I = 16;
  spec.dtype = "BF16";
  spec.options.set_grad_dtype("FP32");
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(MakeProjectionsRequest(spec), 1);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(streamed.status().message(), "d_index_query:"))
      << Describe(streamed.status());
}

// key [1, 6, 2, 8] FP32, index_key [1, 6, 4], and a d_index_key sum of
// 8 * 6 * 4 bytes.
v1::ComputeLossRequest KeySideRequest(const std::string& name) {
  ProjectionsSpec spec;
  spec.name = name;
  spec.H_I = 3, spec.D_I = 4;
  return MakeProjectionsRequest(spec);
}

TEST_F(ServerTest, ProjectionsStreamHoldsItsKeySideToTheFlag) {
  // key [1, 6, 2, 8] FP32: 384 bytes; index_key [1, 6, 4]: 96; the
  // d_index_key sum 8 * 6 * 4 = 192: 672 in all, 480 without the gradient.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_stream_key_bytes=600"}));
  const v1::ComputeLossRequest request = KeySideRequest("KeyLimit");
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(streamed.status().message(), "key:"))
      << Describe(streamed.status());
  EXPECT_TRUE(
      absl::StrContains(streamed.status().message(), "--max_stream_key_bytes"))
      << Describe(streamed.status());
  // A unary call's key side lies in its message (or a region): it holds
  // the d_index_key sum alone, 192 bytes.
  EXPECT_TRUE(client().ComputeLossUnary(request).ok());
  v1::ComputeLossRequest loss_only = request;
  loss_only.mutable_options()->set_skip_grad(true);
  absl::StatusOr<v1::ComputeLossResponse> fits =
      client().ComputeLossStreaming(loss_only);
  EXPECT_TRUE(fits.ok()) << Describe(fits.status());
}

TEST_F(ServerTest, UnaryProjectionsCallsHoldTheirKeyGradientSumToTheFlag) {
  // The d_index_key sum, 8 * 6 * 4 = 192 bytes, had no flag over it in a
  // unary call (up to 4 GiB from a region's BF16 index_key).
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_stream_key_bytes=150"}));
  const v1::ComputeLossRequest request = KeySideRequest("KeySumLimit");
  const absl::Status unary = client().ComputeLossUnary(request).status();
  EXPECT_EQ(unary.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(unary.message(),
            "key: the call would hold 192 bytes for its key side (the "
            "d_index_key sum 192), over the limit of 150 "
            "(--max_stream_key_bytes); send fewer keys (batch entries) per "
            "call")
      << Describe(unary);
  v1::ComputeLossRequest loss_only = request;
  loss_only.mutable_options()->set_skip_grad(true);
  EXPECT_TRUE(client().ComputeLossUnary(loss_only).ok());
}

TEST_F(ServerTest, ProjectionsStreamRefusesAKeyGradientOverTheMessageLimit) {
  // d_index_key [1, 2000, 16] FP32 is 128000 bytes; the header (BF16
  // index_key 64000 bytes) fits 100000.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=100000"}));
  ProjectionsSpec spec;
  spec.name = "KeyGradientLimit";
  spec.T = 4, spec.S = 2000, spec.H = 1, spec.H_kv = 1, spec.D = 1;
  spec.H_I = 1, spec.D_I = 16;
  spec.dtype = "BF16";
  spec.options.set_grad_dtype("FP32");
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(streamed.status().message(), "d_index_key:"))
      << Describe(streamed.status());
}

class ProjectionsStreamErrorTest : public ServerTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartServer()); }

  static v1::ComputeLossRequest Good(int64_t K = 0) {
    ProjectionsSpec spec;
    spec.name = "StreamErrors";
    spec.B = 1, spec.T = 20, spec.S = 20, spec.K = K;
    spec.options.set_causal(true);
    return MakeProjectionsRequest(spec);
  }

  // The streamed call's refusal: `code`, with a message naming `field`.
  void ExpectStreamRefused(
      const v1::ComputeLossRequest& request, const std::string& field,
      absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    absl::StatusOr<v1::ComputeLossResponse> response =
        client().ComputeLossStreaming(request, 6);
    ASSERT_FALSE(response.ok()) << field;
    EXPECT_EQ(response.status().code(), code) << Describe(response.status());
    EXPECT_TRUE(absl::StartsWith(response.status().message(), field + ":"))
        << "want " << field << ", got " << Describe(response.status());
  }

  // `messages` on a raw stream: refused with INVALID_ARGUMENT naming
  // `field`.
  void ExpectRawRefused(
      const std::vector<v1::ComputeLossStreamRequest>& messages,
      const std::string& field) {
    std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub(server().target());
    const StreamOutcome outcome = RunStream(*stub, messages);
    EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << Describe(outcome.status);
    EXPECT_TRUE(absl::StartsWith(outcome.status.error_message(), field + ":"))
        << "want " << field << ", got " << Describe(outcome.status);
  }
};

// MEAN_VALID without row_valid counts the rows with a valid key, which with
// the client's indices needs every row's indices first: the stream refuses
// it, and takes it with row_valid.
TEST_F(ProjectionsStreamErrorTest, MeanValidWithClientIndicesNeedsRowValid) {
  v1::ComputeLossRequest request = Good(/*K=*/4);
  request.mutable_options()->set_reduction(v1::REDUCTION_MEAN_VALID);
  ExpectStreamRefused(request, "reduction");
  // The unary call counts them.
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());

  v1::Tensor& row_valid = *request.mutable_row_valid();
  row_valid.set_dtype("BOOL");
  row_valid.add_shape(1);
  row_valid.add_shape(20);
  row_valid.mutable_data()->assign(20, '\1');
  row_valid.mutable_data()->at(3) = '\0';
  unary = client().ComputeLossUnary(request);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  absl::StatusOr<v1::ComputeLossResponse> streamed =
      client().ComputeLossStreaming(request, 6);
  ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
  EXPECT_TRUE(SameResponse(*unary, *streamed));
}

TEST_F(ProjectionsStreamErrorTest, BlocksOutOfOrderNameRowBegin) {
  const v1::ComputeLossRequest request = Good();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << Describe(slicer.status());
  ExpectRawRefused({HeaderMessage(*slicer), BlockMessage(*slicer, 0, 5),
                    BlockMessage(*slicer, 6, 5)},
                   "row_begin, num_rows");
  // Not every row: the result is refused.
  ExpectRawRefused({HeaderMessage(*slicer), BlockMessage(*slicer, 0, 5)},
                   "row_begin, num_rows");
  ExpectRawRefused({HeaderMessage(*slicer)}, "row_begin, num_rows");
}

TEST_F(ProjectionsStreamErrorTest, ABlockMissingATensorNamesIt) {
  const v1::ComputeLossRequest request = Good();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << Describe(slicer.status());
  for (const std::string field : {"query", "index_query", "index_weights"}) {
    v1::ComputeLossStreamRequest block = BlockMessage(*slicer, 0, 20);
    FindRequestTensor(field)
        ->mutable_block_bytes(*block.mutable_block())
        ->clear();
    ExpectRawRefused({HeaderMessage(*slicer), block}, field);
  }
  // lse bytes where the header has no lse.
  v1::ComputeLossStreamRequest block = BlockMessage(*slicer, 0, 20);
  block.mutable_block()->set_lse(std::string(20 * 2 * 4, '\0'));
  ExpectRawRefused({HeaderMessage(*slicer), block}, "lse");
  // The projections form has no counting pass.
  ExpectRawRefused(
      {HeaderMessage(*slicer), BlockMessage(*slicer, 0, 20, /*counting=*/true)},
      "counting");
}

// NaN in a block's query rows and in the header's key side are refused
// naming the tensor, as in the unary call.
TEST_F(ProjectionsStreamErrorTest, NonFiniteValuesNameTheTensor) {
  v1::ComputeLossRequest request = Good();
  SetFloat(*request.mutable_query(), 200, std::nanf(""));
  ExpectStreamRefused(request, "query");
  request = Good();
  SetFloat(*request.mutable_index_key(), 5, std::nanf(""));
  ExpectStreamRefused(request, "index_key");
}

}  // namespace
}  // namespace klserve::integration
