// Per-row key bounds (key_start <= s < key_end) over the real server: the
// THD layout of fused attention kernels, B = 1 with several documents packed
// along T, each row seeing its own document's keys. Unary answers equal the
// float64 reference (tests/reference), streamed ones (the bounds travel in
// the StreamHeader) equal the unary ones bit for bit, crossed bounds leave
// a row no key, and bounds outside the contract's are INVALID_ARGUMENT
// naming the tensor.

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "klserve/v1/klserve.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/reference_problems.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klserve::integration {
namespace {

// Documents of `lengths` packed along T = S = sum(lengths), B = 1: row t
// sees keys [start of its document, end), end being t + 1 (`causal`) or the
// end of its document. Rows listed in `empty` get key_start = key_end, no
// key at all.
void SetDocuments(const std::vector<int32_t>& lengths, bool causal,
                  const std::vector<int32_t>& empty,
                  v1::ComputeLossRequest& request) {
  std::vector<int32_t> start, end;
  int32_t begin = 0;
  for (const int32_t length : lengths) {
    for (int32_t t = begin; t < begin + length; ++t) {
      start.push_back(begin);
      end.push_back(causal ? t + 1 : begin + length);
    }
    begin += length;
  }
  for (const int32_t row : empty) end[row] = start[row];
  *request.mutable_key_start() = Int32Tensor({1, begin}, start);
  *request.mutable_key_end() = Int32Tensor({1, begin}, end);
}

ProblemSpec DocumentSpec(const std::string& name, int64_t H, int64_t K,
                         uint64_t seed) {
  ProblemSpec s;
  s.name = name;
  s.B = 1, s.T = 12, s.S = 12, s.H = H, s.K = K;
  s.options.set_want_row_kl(true);
  s.seed = seed;
  return s;
}

class KeyBoundsTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  // The unary answer against the reference, and the streamed one (blocks of
  // 5 rows, so that blocks cross documents) against the unary one.
  // `fully_masked`, when given, is the reference's count of rows without a
  // key (the bounds' doing, not a mistake of the test's data).
  void ExpectServedAsTheReference(const v1::ComputeLossRequest& request,
                                  std::optional<int64_t> fully_masked) {
    const klref::RefResult ref = klref::ComputeReference(RefProblemOf(request));
    ASSERT_TRUE(ref.error.empty()) << ref.error;
    if (fully_masked) {
      EXPECT_EQ(ref.rows_fully_masked, *fully_masked);
    }
    absl::StatusOr<v1::ComputeLossResponse> unary =
        client().ComputeLossUnary(request);
    ASSERT_TRUE(unary.ok()) << Describe(unary.status());
    EXPECT_TRUE(CloseResult(ref, *unary, 1e-5));
    EXPECT_TRUE(CloseTensor(ref.grad, unary->grad(),
                            GradTolerance(request.options().grad_dtype())));
    absl::StatusOr<v1::ComputeLossResponse> streamed =
        client().ComputeLossStreaming(request, /*block_rows=*/5);
    ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
    EXPECT_TRUE(SameResponse(*unary, *streamed));
  }
};

TEST_F(KeyBoundsTest, CausalDocumentsPerHeadLogits) {
  v1::ComputeLossRequest request =
      MakeRequest(DocumentSpec("CausalDocuments", /*H=*/3, /*K=*/0, 21));
  SetDocuments({5, 4, 3}, /*causal=*/true, {}, request);
  ExpectServedAsTheReference(request, 0);
}

// Bidirectional documents under the causal rule too: a row sees its
// document's keys up to itself (the AND of both rules), and the rows given
// no key are fully masked.
TEST_F(KeyBoundsTest, WholeDocumentsAndCausalAggregatedMaxText) {
  ProblemSpec spec = DocumentSpec("WholeDocuments", /*H=*/0, /*K=*/0, 22);
  spec.options.set_causal(true);
  spec.options.set_flavor(v1::FLAVOR_MAXTEXT);
  spec.options.set_reduction(v1::REDUCTION_SUM);
  spec.options.set_grad_dtype("BF16");
  v1::ComputeLossRequest request = MakeRequest(spec);
  SetDocuments({3, 6, 3}, /*causal=*/false, {4, 10}, request);
  ExpectServedAsTheReference(request, 2);
}

TEST_F(KeyBoundsTest, SparseSlotsOutsideTheBoundsAreInvalid) {
  ProblemSpec spec = DocumentSpec("SparseDocuments", /*H=*/2, /*K=*/5, 23);
  spec.options.set_reduction(v1::REDUCTION_MEAN_VALID);
  v1::ComputeLossRequest request = MakeRequest(spec);
  SetDocuments({7, 5}, /*causal=*/true, {}, request);
  ExpectServedAsTheReference(request, std::nullopt);
}

// The contract asks only 0 <= key_start and key_end <= S: a start past S,
// an end below 0 or a start past its end leaves the row no key, in the
// dense and the sparse stage, under the causal cut and streamed too.
TEST_F(KeyBoundsTest, CrossedBoundsLeaveTheRowNoKey) {
  for (const int64_t K : {0, 5}) {
    SCOPED_TRACE(K == 0 ? "dense" : "sparse");
    ProblemSpec spec = DocumentSpec("CrossedBounds", /*H=*/2, K, 25 + K);
    spec.options.set_causal(true);
    spec.options.set_reduction(v1::REDUCTION_MEAN_VALID);
    v1::ComputeLossRequest request = MakeRequest(spec);
    std::vector<int32_t> start(12, 0), end(12, 12);
    start[2] = 13;  // past S
    start[5] = 2147483647;
    end[7] = -3;  // below 0
    end[8] = -2147483647 - 1;
    start[10] = 9, end[10] = 4;  // crossed within [0, S]
    *request.mutable_key_start() = Int32Tensor({1, 12}, start);
    *request.mutable_key_end() = Int32Tensor({1, 12}, end);
    ExpectServedAsTheReference(
        request, K == 0 ? std::optional<int64_t>(5) : std::nullopt);
  }
}

TEST_F(KeyBoundsTest, BadBoundsAreInvalidArgumentNamingTheTensor) {
  const v1::ComputeLossRequest good =
      MakeRequest(DocumentSpec("BadBounds", /*H=*/2, /*K=*/0, 24));
  const auto expect_refused = [&](const v1::ComputeLossRequest& request,
                                  const std::string& field) {
    absl::StatusOr<v1::ComputeLossResponse> response =
        client().ComputeLossUnary(request);
    ASSERT_FALSE(response.ok());
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(response.status().message(), field + ":"))
        << response.status().message();
  };
  v1::ComputeLossRequest past_s = good;
  SetDocuments({6, 6}, /*causal=*/false, {}, past_s);
  std::vector<int32_t> end(12, 13);  // S + 1
  *past_s.mutable_key_end() = Int32Tensor({1, 12}, end);
  expect_refused(past_s, "key_end");

  v1::ComputeLossRequest negative = good;
  SetDocuments({6, 6}, /*causal=*/false, {}, negative);
  std::vector<int32_t> start(12, 0);
  start[7] = -1;
  *negative.mutable_key_start() = Int32Tensor({1, 12}, start);
  expect_refused(negative, "key_start");

  v1::ComputeLossRequest alone = good;
  SetDocuments({6, 6}, /*causal=*/false, {}, alone);
  alone.clear_key_end();
  expect_refused(alone, "key_end");

  v1::ComputeLossRequest wrong_shape = good;
  SetDocuments({6, 6}, /*causal=*/false, {}, wrong_shape);
  *wrong_shape.mutable_key_start() =
      Int32Tensor({1, 11}, std::vector<int32_t>(11, 0));
  expect_refused(wrong_shape, "key_start");
}

}  // namespace
}  // namespace klserve::integration
