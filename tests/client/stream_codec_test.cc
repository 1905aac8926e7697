#include "client/stream_codec.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace klserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kH = 3, kT = 5, kK = 4, kS = 7;

// A tensor whose element i holds the value i (as T), so a copied byte range
// tells where it came from.
template <typename T>
v1::Tensor Iota(const std::string& dtype, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  std::vector<T> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<T>(i);
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  tensor.set_data(values.data(), count * sizeof(T));
  return tensor;
}

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// A sparse-stage request with every per-row tensor and every small tensor.
v1::ComputeLossRequest FullRequest() {
  v1::ComputeLossRequest request;
  request.set_request_id("req-7");
  request.mutable_tags()->set_run("run-a");
  request.mutable_tags()->set_step(12);
  request.mutable_options()->set_num_keys(kS);
  request.mutable_options()->set_want_row_kl(true);
  *request.mutable_attention_logits() = Iota<float>("FP32", {kB, kH, kT, kK});
  *request.mutable_indexer_scores() = Iota<uint16_t>("BF16", {kB, kT, kK});
  *request.mutable_topk_indices() = Iota<int32_t>("INT32", {kB, kT, kK});
  *request.mutable_attention_mask() = Iota<uint8_t>("BOOL", {kB, kT, kS});
  *request.mutable_segment_ids_q() = Iota<int32_t>("INT32", {kB, kT});
  *request.mutable_segment_ids_kv() = Iota<int32_t>("INT32", {kB, kS});
  *request.mutable_key_padding_mask() = Iota<uint8_t>("BOOL", {kB, kS});
  *request.mutable_row_valid() = Iota<uint8_t>("BOOL", {kB, kT});
  return request;
}

TEST(RequestSlicer, HeaderCarriesSpecsAndSmallTensorsWhole) {
  const v1::ComputeLossRequest request = FullRequest();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  const v1::StreamHeader header = slicer->MakeHeader();
  EXPECT_EQ(header.request_id(), "req-7");
  EXPECT_EQ(header.tags().run(), "run-a");
  EXPECT_EQ(header.tags().step(), 12);
  EXPECT_EQ(header.options().num_keys(), kS);
  EXPECT_TRUE(header.options().want_row_kl());
  EXPECT_EQ(header.attention_logits().dtype(), "FP32");
  EXPECT_THAT(header.attention_logits().shape(), ElementsAre(kB, kH, kT, kK));
  EXPECT_FALSE(header.has_attention_weights());
  EXPECT_EQ(header.indexer_scores().dtype(), "BF16");
  EXPECT_THAT(header.topk_indices().shape(), ElementsAre(kB, kT, kK));
  EXPECT_THAT(header.attention_mask().shape(), ElementsAre(kB, kT, kS));
  EXPECT_EQ(header.segment_ids_q().data(), request.segment_ids_q().data());
  EXPECT_EQ(header.segment_ids_kv().data(), request.segment_ids_kv().data());
  EXPECT_EQ(header.key_padding_mask().data(),
            request.key_padding_mask().data());
  EXPECT_EQ(header.row_valid().data(), request.row_valid().data());
}

TEST(RequestSlicer, BlocksCrossingBatchBoundariesHoldTheRightRows) {
  const v1::ComputeLossRequest request = FullRequest();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  ASSERT_EQ(slicer->num_rows(), kB * kT);

  // 3-row blocks: [3, 6) spans b = 0 and b = 1; the last block is short.
  int64_t covered = 0;
  for (int64_t begin = 0; begin < slicer->num_rows(); begin += 3) {
    const int64_t n = std::min<int64_t>(3, slicer->num_rows() - begin);
    v1::RowBlock block;
    slicer->FillBlock(begin, n, &block);
    EXPECT_EQ(block.row_begin(), begin);
    EXPECT_EQ(block.num_rows(), n);
    EXPECT_TRUE(block.attention_weights().empty());

    // Logits: [H, n, K], element (h, i, k) from ((b*H + h)*T + t)*K + k.
    const std::vector<float> logits = Values<float>(block.attention_logits());
    ASSERT_EQ(static_cast<int64_t>(logits.size()), kH * n * kK);
    for (int64_t h = 0; h < kH; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = (begin + i) / kT, t = (begin + i) % kT;
        for (int64_t k = 0; k < kK; ++k) {
          EXPECT_EQ(logits[(h * n + i) * kK + k],
                    static_cast<float>(((b * kH + h) * kT + t) * kK + k))
              << "h=" << h << " row=" << begin + i << " k=" << k;
        }
      }
    }
    // Per-row tensors [n, X]: rows begin.. of the flattened [B*T, X].
    const std::vector<uint16_t> scores =
        Values<uint16_t>(block.indexer_scores());
    const std::vector<int32_t> topk = Values<int32_t>(block.topk_indices());
    const std::vector<uint8_t> mask = Values<uint8_t>(block.attention_mask());
    ASSERT_EQ(static_cast<int64_t>(scores.size()), n * kK);
    ASSERT_EQ(static_cast<int64_t>(topk.size()), n * kK);
    ASSERT_EQ(static_cast<int64_t>(mask.size()), n * kS);
    for (int64_t j = 0; j < n * kK; ++j) {
      EXPECT_EQ(scores[j], begin * kK + j);
      EXPECT_EQ(topk[j], begin * kK + j);
    }
    for (int64_t j = 0; j < n * kS; ++j) {
      EXPECT_EQ(mask[j], static_cast<uint8_t>(begin * kS + j));
    }
    covered += n;
  }
  EXPECT_EQ(covered, kB * kT);
}

TEST(RequestSlicer, ReusedBlockIsOverwrittenNotAppended) {
  const v1::ComputeLossRequest request = FullRequest();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  v1::RowBlock block;
  slicer->FillBlock(0, 4, &block);
  slicer->FillBlock(4, 1, &block);
  EXPECT_EQ(static_cast<int64_t>(block.indexer_scores().size()), kK * 2);
  EXPECT_EQ(Values<uint16_t>(block.indexer_scores())[0], 4 * kK);
}

TEST(RequestSlicer, BlockRowsFollowBlockBytes) {
  const v1::ComputeLossRequest request = FullRequest();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  const int64_t row_bytes = kH * kK * 4 + kK * 2 + kK * 4 + kS;
  EXPECT_EQ(slicer->row_bytes(), row_bytes);
  EXPECT_EQ(slicer->BlockRowsFor(1), 1);
  EXPECT_EQ(slicer->BlockRowsFor(3 * row_bytes + 1), 3);
  EXPECT_EQ(slicer->BlockRowsFor(int64_t{1} << 40), kB * kT);
}

// Only MEAN_VALID without row_valid needs its N counted first.
TEST(RequestSlicer, CountsFirstForMeanValidWithoutRowValid) {
  v1::ComputeLossRequest request = FullRequest();
  for (v1::Reduction reduction :
       {v1::REDUCTION_UNSPECIFIED, v1::REDUCTION_MEAN, v1::REDUCTION_SUM,
        v1::REDUCTION_MEAN_VALID}) {
    for (bool row_valid : {true, false}) {
      if (!row_valid) request.clear_row_valid();
      request.mutable_options()->set_reduction(reduction);
      absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
      ASSERT_TRUE(slicer.ok()) << slicer.status();
      EXPECT_EQ(slicer->counts_first(),
                reduction == v1::REDUCTION_MEAN_VALID && !row_valid)
          << reduction << " " << row_valid;
    }
    *request.mutable_row_valid() = FullRequest().row_valid();
  }
}

TEST(RequestSlicer, RejectsMissingScores) {
  v1::ComputeLossRequest request = FullRequest();
  request.clear_indexer_scores();
  absl::Status status = RequestSlicer::Create(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("indexer_scores:"));
}

TEST(RequestSlicer, RejectsMismatchedBatchInLogits) {
  v1::ComputeLossRequest request = FullRequest();
  *request.mutable_attention_logits() =
      Iota<float>("FP32", {kB + 1, kH, kT, kK});
  absl::Status status = RequestSlicer::Create(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("attention_logits: shape must be [B, H, T, S or K]"));
}

TEST(RequestSlicer, RejectsWrongRank) {
  v1::ComputeLossRequest request = FullRequest();
  *request.mutable_attention_mask() = Iota<uint8_t>("BOOL", {kB * kT, kS});
  absl::Status status = RequestSlicer::Create(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("attention_mask:"));
}

TEST(RequestSlicer, RejectsShortData) {
  v1::ComputeLossRequest request = FullRequest();
  request.mutable_topk_indices()->mutable_data()->resize(5);
  absl::Status status = RequestSlicer::Create(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("topk_indices: data must be"));
}

TEST(RequestSlicer, RejectsUnknownDtype) {
  v1::ComputeLossRequest request = FullRequest();
  request.mutable_indexer_scores()->set_dtype("FP8");
  absl::Status status = RequestSlicer::Create(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("indexer_scores."));
}

v1::GradBlock MakeGradBlock(int64_t begin, int64_t n, bool with_grad,
                            bool with_row_kl) {
  v1::GradBlock block;
  block.set_row_begin(begin);
  block.set_num_rows(n);
  if (with_grad) {
    std::vector<float> grad(n * kK);
    for (int64_t j = 0; j < n * kK; ++j) grad[j] = begin * kK + j;
    block.mutable_grad()->set_dtype("FP32");
    block.mutable_grad()->add_shape(n);
    block.mutable_grad()->add_shape(kK);
    block.mutable_grad()->set_data(grad.data(), grad.size() * sizeof(float));
  }
  if (with_row_kl) {
    std::vector<double> kl(n);
    for (int64_t i = 0; i < n; ++i) kl[i] = begin + i;
    block.mutable_row_kl()->set_dtype("FP64");
    block.mutable_row_kl()->add_shape(n);
    block.mutable_row_kl()->set_data(kl.data(), n * sizeof(double));
  }
  return block;
}

TEST(ResponseAssembler, JoinsBlocksIntoFullTensors) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  ResponseAssembler assembler(shape);
  for (auto [begin, n] : {std::pair<int64_t, int64_t>{0, 4}, {4, 3}, {7, 3}}) {
    v1::GradBlock block = MakeGradBlock(begin, n, true, true);
    ASSERT_TRUE(assembler.Add(block).ok());
  }
  v1::ComputeLossResponse final_result;
  final_result.set_request_id("req-7");
  final_result.mutable_result()->set_loss(0.25);
  absl::StatusOr<v1::ComputeLossResponse> response =
      assembler.Finish(final_result);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->request_id(), "req-7");
  EXPECT_EQ(response->result().loss(), 0.25);
  EXPECT_EQ(response->grad().dtype(), "FP32");
  EXPECT_THAT(response->grad().shape(), ElementsAre(kB, kT, kK));
  const std::vector<float> grad = Values<float>(response->grad().data());
  ASSERT_EQ(static_cast<int64_t>(grad.size()), kB * kT * kK);
  for (int64_t j = 0; j < kB * kT * kK; ++j) EXPECT_EQ(grad[j], j);
  EXPECT_EQ(response->row_kl().dtype(), "FP64");
  EXPECT_THAT(response->row_kl().shape(), ElementsAre(kB, kT));
  const std::vector<double> kl = Values<double>(response->row_kl().data());
  ASSERT_EQ(static_cast<int64_t>(kl.size()), kB * kT);
  for (int64_t r = 0; r < kB * kT; ++r) EXPECT_EQ(kl[r], r);
}

TEST(ResponseAssembler, LeavesGradOutWhenBlocksHaveNone) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  ResponseAssembler assembler(shape);
  v1::GradBlock block = MakeGradBlock(0, kB * kT, false, false);
  ASSERT_TRUE(assembler.Add(block).ok());
  absl::StatusOr<v1::ComputeLossResponse> response =
      assembler.Finish(v1::ComputeLossResponse());
  ASSERT_TRUE(response.ok());
  EXPECT_FALSE(response->has_grad());
  EXPECT_FALSE(response->has_row_kl());
}

TEST(ResponseAssembler, DropsTheCountingPass) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  ResponseAssembler assembler(shape, /*counting_pass=*/true);
  for (auto [begin, n] : {std::pair<int64_t, int64_t>{0, 3}, {3, 7}}) {
    v1::GradBlock counted = MakeGradBlock(begin, n, false, false);
    ASSERT_TRUE(assembler.Add(counted).ok());
  }
  EXPECT_EQ(assembler.rows_done(), 0);  // the gradient pass starts over
  // Before the gradient pass is complete the result is early.
  EXPECT_EQ(assembler.Finish(v1::ComputeLossResponse()).status().code(),
            absl::StatusCode::kInternal);
  ResponseAssembler counted_then_joined(shape, /*counting_pass=*/true);
  v1::GradBlock counted = MakeGradBlock(0, kB * kT, false, false);
  ASSERT_TRUE(counted_then_joined.Add(counted).ok());
  for (auto [begin, n] : {std::pair<int64_t, int64_t>{0, 6}, {6, 4}}) {
    v1::GradBlock block = MakeGradBlock(begin, n, true, true);
    ASSERT_TRUE(counted_then_joined.Add(block).ok());
  }
  absl::StatusOr<v1::ComputeLossResponse> response =
      counted_then_joined.Finish(v1::ComputeLossResponse());
  ASSERT_TRUE(response.ok()) << response.status();
  const std::vector<float> grad = Values<float>(response->grad().data());
  ASSERT_EQ(static_cast<int64_t>(grad.size()), kB * kT * kK);
  for (int64_t j = 0; j < kB * kT * kK; ++j) EXPECT_EQ(grad[j], j);
  const std::vector<double> kl = Values<double>(response->row_kl().data());
  ASSERT_EQ(static_cast<int64_t>(kl.size()), kB * kT);
  for (int64_t r = 0; r < kB * kT; ++r) EXPECT_EQ(kl[r], r);
}

TEST(ResponseAssembler, RejectsACountingBlockWithTensorsOrOutOfOrder) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  for (auto [with_grad, with_row_kl] :
       {std::pair{true, false}, {false, true}}) {
    ResponseAssembler assembler(shape, /*counting_pass=*/true);
    v1::GradBlock block = MakeGradBlock(0, 2, with_grad, with_row_kl);
    absl::Status status = assembler.Add(block);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(status.message()), HasSubstr("counting block"));
  }
  ResponseAssembler assembler(shape, /*counting_pass=*/true);
  v1::GradBlock block = MakeGradBlock(2, 2, false, false);
  EXPECT_THAT(std::string(assembler.Add(block).message()),
              HasSubstr("do not continue"));
}

TEST(ResponseAssembler, RejectsGapOverlapAndOverrun) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  for (auto [begin, n] :
       {std::pair<int64_t, int64_t>{1, 2}, {0, 0}, {0, kB * kT + 1}}) {
    ResponseAssembler assembler(shape);
    v1::GradBlock block = MakeGradBlock(begin, n, false, false);
    absl::Status status = assembler.Add(block);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(status.message()), HasSubstr("do not continue"));
  }
}

TEST(ResponseAssembler, RejectsWrongGradSize) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  ResponseAssembler assembler(shape);
  v1::GradBlock block = MakeGradBlock(0, 2, true, false);
  block.mutable_grad()->mutable_data()->pop_back();
  EXPECT_EQ(assembler.Add(block).code(), absl::StatusCode::kInternal);
}

TEST(ResponseAssembler, RejectsGradInSomeBlocksOnly) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  ResponseAssembler assembler(shape);
  v1::GradBlock first = MakeGradBlock(0, 2, true, false);
  ASSERT_TRUE(assembler.Add(first).ok());
  v1::GradBlock second = MakeGradBlock(2, 2, false, false);
  EXPECT_EQ(assembler.Add(second).code(), absl::StatusCode::kInternal);
}

TEST(ResponseAssembler, FinishBeforeLastRowIsAnError) {
  const std::vector<int64_t> shape = {kB, kT, kK};
  ResponseAssembler assembler(shape);
  v1::GradBlock block = MakeGradBlock(0, 3, true, false);
  ASSERT_TRUE(assembler.Add(block).ok());
  absl::Status status = assembler.Finish(v1::ComputeLossResponse()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status.message()), HasSubstr("3 of 10 rows"));
}

// The projections form: query [B, T, H, D], lse [B, H, T] and the indexer's
// query side per row; key and index_key whole.
constexpr int64_t kD = 2, kHi = 2, kDi = 3, kSk = 6;

v1::ComputeLossRequest ProjectionsRequest() {
  v1::ComputeLossRequest request;
  request.set_request_id("proj-1");
  *request.mutable_query() = Iota<float>("FP32", {kB, kT, kH, kD});
  *request.mutable_key() = Iota<float>("FP32", {kB, kSk, 1, kD});
  *request.mutable_lse() = Iota<float>("FP32", {kB, kH, kT});
  *request.mutable_index_query() = Iota<uint16_t>("BF16", {kB, kT, kHi, kDi});
  *request.mutable_index_key() = Iota<uint16_t>("BF16", {kB, kSk, kDi});
  *request.mutable_index_weights() = Iota<float>("FP32", {kB, kT, kHi});
  *request.mutable_row_valid() = Iota<uint8_t>("BOOL", {kB, kT});
  return request;
}

// A block's answer must fit as its rows do: where a row's answer is the
// larger (here a top-k selection of 512 slots, 2 KiB a row, against 57
// bytes of rows), it sets the rows per block (a helper's finding: the
// default blocks' answers passed the message limit).
TEST(RequestSlicer, BlockRowsFollowTheLargerOfARowAndItsAnswer) {
  v1::ComputeLossRequest request = ProjectionsRequest();
  const int64_t grads = (kHi * kDi + kHi) * 4;  // FP32 by default
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  const int64_t row_bytes = slicer->row_bytes();
  ASSERT_GT(row_bytes, grads);
  EXPECT_EQ(slicer->BlockRowsFor(2 * row_bytes), 2);
  request.mutable_options()->set_topk(512);
  request.mutable_options()->set_want_row_kl(true);
  const int64_t answer = grads + 512 * 4 + 8;
  ASSERT_GT(answer, row_bytes);
  slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  EXPECT_EQ(slicer->BlockRowsFor(2 * answer), 2);
  EXPECT_EQ(slicer->BlockRowsFor(2 * answer - 1), 1);
  // Without the gradients, the selection and row KL alone.
  request.mutable_options()->set_skip_grad(true);
  slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  EXPECT_EQ(slicer->BlockRowsFor(3 * (512 * 4 + 8)), 3);
}

// The one kind the stream cannot carry: the projections form under
// MEAN_VALID without row_valid, with topk_indices or an attention_mask.
TEST(StreamCarries, AllButProjectionsMeanValidThatNeedsEveryRow) {
  for (bool projections : {false, true}) {
    for (v1::Reduction reduction :
         {v1::REDUCTION_MEAN, v1::REDUCTION_SUM, v1::REDUCTION_MEAN_VALID}) {
      for (int per_row : {0, 1, 2}) {  // none, topk_indices, attention_mask
        for (bool row_valid : {false, true}) {
          v1::ComputeLossRequest request =
              projections ? ProjectionsRequest() : FullRequest();
          request.mutable_options()->set_reduction(reduction);
          if (!row_valid) request.clear_row_valid();
          request.clear_topk_indices();
          request.clear_attention_mask();
          if (per_row == 1) {
            *request.mutable_topk_indices() =
                Iota<int32_t>("INT32", {kB, kT, 2});
          } else if (per_row == 2) {
            *request.mutable_attention_mask() =
                Iota<uint8_t>("BOOL", {kB, kT, kSk});
          }
          EXPECT_EQ(StreamCarries(request),
                    !(projections && reduction == v1::REDUCTION_MEAN_VALID &&
                      per_row != 0 && !row_valid))
              << projections << " " << reduction << " " << per_row << " "
              << row_valid;
        }
      }
    }
  }
}

TEST(RequestSlicer, ProjectionsHeaderCarriesTheKeySideWhole) {
  const v1::ComputeLossRequest request = ProjectionsRequest();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  EXPECT_EQ(slicer->form(), RequestForm::kProjections);
  EXPECT_EQ(slicer->num_rows(), kB * kT);
  EXPECT_FALSE(slicer->counts_first());
  const v1::StreamHeader header = slicer->MakeHeader();
  EXPECT_EQ(header.key().data(), request.key().data());
  EXPECT_EQ(header.index_key().data(), request.index_key().data());
  EXPECT_EQ(header.row_valid().data(), request.row_valid().data());
  EXPECT_THAT(header.query().shape(), ElementsAre(kB, kT, kH, kD));
  EXPECT_THAT(header.lse().shape(), ElementsAre(kB, kH, kT));
  EXPECT_EQ(header.index_query().dtype(), "BF16");
  EXPECT_THAT(header.index_weights().shape(), ElementsAre(kB, kT, kHi));
  // Query row bytes: H * D + H (lse) + H_I * D_I (BF16) + H_I floats.
  EXPECT_EQ(slicer->row_bytes(), (kH * kD + kH + kHi) * 4 + kHi * kDi * 2);
}

// Rows 3..6 cross from batch entry 0 (T = 5) into entry 1.
TEST(RequestSlicer, ProjectionsBlocksCarryTheQuerySideRows) {
  const v1::ComputeLossRequest request = ProjectionsRequest();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  v1::RowBlock block;
  slicer->FillBlock(3, 4, &block);
  // query [n, H, D]: rows r hold elements r * H * D on.
  std::vector<float> query;
  for (int64_t r = 3; r < 7; ++r) {
    for (int64_t i = 0; i < kH * kD; ++i) query.push_back(r * kH * kD + i);
  }
  EXPECT_EQ(Values<float>(block.query()), query);
  // lse [H, n]: head h's rows of entry b at (b * H + h) * T + t.
  std::vector<float> lse;
  for (int64_t h = 0; h < kH; ++h) {
    for (int64_t r = 3; r < 7; ++r) {
      lse.push_back((r / kT * kH + h) * kT + r % kT);
    }
  }
  EXPECT_EQ(Values<float>(block.lse()), lse);
  EXPECT_EQ(block.index_query().size(), 4 * kHi * kDi * 2);
  EXPECT_EQ(Values<float>(block.index_weights()).front(), 3 * kHi);
  EXPECT_TRUE(block.indexer_scores().empty());
}

TEST(RequestSlicer, ProjectionsRowTensorsMustAgreeWithTheQuery) {
  v1::ComputeLossRequest request = ProjectionsRequest();
  *request.mutable_index_weights() = Iota<float>("FP32", {kB, kT + 1, kHi});
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  EXPECT_EQ(slicer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(slicer.status().message()),
              HasSubstr("index_weights: shape must be [B, T, H_I]"));
  EXPECT_THAT(std::string(slicer.status().message()), HasSubstr("from query"));
}

// A projections GradBlock of rows [begin, begin + n): d_index_query FP32
// [n, H_I, D_I] holding r * 100 + i, d_index_weights [n, H_I].
v1::GradBlock ProjectionsGradBlock(int64_t begin, int64_t n) {
  v1::GradBlock block;
  block.set_row_begin(begin);
  block.set_num_rows(n);
  if (n == 0) return block;
  std::vector<float> dq, dw;
  for (int64_t r = begin; r < begin + n; ++r) {
    for (int64_t i = 0; i < kHi * kDi; ++i) dq.push_back(r * 100 + i);
    for (int64_t i = 0; i < kHi; ++i) dw.push_back(-r * 100 - i);
  }
  v1::Tensor* q = block.mutable_d_index_query();
  q->set_dtype("FP32");
  for (const int64_t d : {n, kHi, kDi}) q->add_shape(d);
  q->set_data(dq.data(), dq.size() * sizeof(float));
  v1::Tensor* w = block.mutable_d_index_weights();
  w->set_dtype("FP32");
  for (const int64_t d : {n, kHi}) w->add_shape(d);
  w->set_data(dw.data(), dw.size() * sizeof(float));
  return block;
}

TEST(ProjectionsResponseAssembler, AssemblesBlocksOfTheCompletedRows) {
  ProjectionsResponseAssembler assembler(kB, kT);
  // A block that completed nothing, one that completed earlier rows too.
  for (auto [begin, n] :
       {std::pair<int64_t, int64_t>{0, 0}, {0, 4}, {4, 0}, {4, 6}}) {
    v1::GradBlock block = ProjectionsGradBlock(begin, n);
    ASSERT_TRUE(assembler.Add(block).ok()) << begin << "+" << n;
  }
  v1::ComputeLossResponse last;
  last.set_request_id("proj-1");
  last.mutable_d_index_key()->set_dtype("FP32");
  absl::StatusOr<v1::ComputeLossResponse> response =
      assembler.Finish(std::move(last));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->request_id(), "proj-1");
  EXPECT_TRUE(response->has_d_index_key());
  EXPECT_FALSE(response->has_topk_indices());
  EXPECT_FALSE(response->has_row_kl());
  EXPECT_THAT(response->d_index_query().shape(), ElementsAre(kB, kT, kHi, kDi));
  EXPECT_THAT(response->d_index_weights().shape(), ElementsAre(kB, kT, kHi));
  const std::vector<float> dq = Values<float>(response->d_index_query().data());
  ASSERT_EQ(dq.size(), kB * kT * kHi * kDi);
  for (int64_t r = 0; r < kB * kT; ++r) {
    EXPECT_EQ(dq[r * kHi * kDi + 1], r * 100 + 1) << r;
  }
}

TEST(ProjectionsResponseAssembler, RejectsWhatBreaksTheProtocol) {
  {
    ProjectionsResponseAssembler assembler(kB, kT);
    v1::GradBlock gap = ProjectionsGradBlock(1, 2);
    EXPECT_THAT(std::string(assembler.Add(gap).message()),
                HasSubstr("do not continue"));
  }
  {
    ProjectionsResponseAssembler assembler(kB, kT);
    v1::GradBlock empty = ProjectionsGradBlock(0, 0);
    *empty.mutable_d_index_query() = ProjectionsGradBlock(0, 1).d_index_query();
    EXPECT_THAT(std::string(assembler.Add(empty).message()),
                HasSubstr("of no rows"));
  }
  {
    ProjectionsResponseAssembler assembler(kB, kT);
    v1::GradBlock first = ProjectionsGradBlock(0, 2);
    ASSERT_TRUE(assembler.Add(first).ok());
    v1::GradBlock second = ProjectionsGradBlock(2, 2);
    second.clear_d_index_weights();
    EXPECT_THAT(std::string(assembler.Add(second).message()),
                HasSubstr("unlike the first block"));
  }
  {
    ProjectionsResponseAssembler assembler(kB, kT);
    v1::GradBlock short_rows = ProjectionsGradBlock(0, 2);
    short_rows.mutable_d_index_query()->set_shape(0, 1);
    EXPECT_EQ(assembler.Add(short_rows).code(), absl::StatusCode::kInternal);
  }
  // Row shapes no rows could have: the client had multiplied them unchecked
  // (a signed overflow) and reserved their product for every row, which
  // threw out of the library.
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{-1, 4},
                                           {0, 4},
                                           {int64_t{1} << 40, int64_t{1} << 40},
                                           {int64_t{1} << 60, 1}}) {
    ProjectionsResponseAssembler assembler(kB, kT);
    v1::GradBlock block = ProjectionsGradBlock(0, 2);
    v1::Tensor* q = block.mutable_d_index_query();
    q->clear_shape();
    q->add_shape(2);
    for (const int64_t d : dims) q->add_shape(d);
    const absl::Status status = assembler.Add(block);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << dims[0];
    EXPECT_THAT(std::string(status.message()), HasSubstr("has rows shaped"))
        << dims[0];
  }
  {
    ProjectionsResponseAssembler assembler(kB, kT);
    v1::GradBlock block = ProjectionsGradBlock(0, 3);
    ASSERT_TRUE(assembler.Add(block).ok());
    absl::Status status = assembler.Finish(v1::ComputeLossResponse()).status();
    EXPECT_THAT(std::string(status.message()), HasSubstr("3 of 10 rows"));
  }
}

}  // namespace
}  // namespace klserve
