// The row-range entry points: blocks of rows fed in order to a
// LossComputation (over the whole request's tensors or over separately sent
// copies of the block's rows, and, for MEAN_VALID without row_valid, after a
// counting pass split in its own blocks) reproduce the whole-problem call bit
// for bit, whatever the block sizes, thread counts or concurrent callers.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/loss.h"
#include "kernels/loss_accumulator.h"
#include "kernels/loss_computation.h"
#include "kernels/problem.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"

namespace klserve::testdata {
namespace {

struct Outputs {
  IndexerKlResult result;
  std::vector<std::byte> grad;
  std::vector<double> row_kl;
};

int64_t GradBytes(const Case& c) {
  return c.num_rows() * c.slots() * DTypeSize(c.options.grad_dtype);
}

Outputs RunWhole(Backend& backend, const IndexerKlProblem& problem,
                 const RowData& rows, const Case& c) {
  Outputs out;
  out.grad.assign(GradBytes(c), std::byte{0xff});
  out.row_kl.assign(c.num_rows(), -1.0);
  LossOutputs outputs;
  if (c.options.want_grad) {
    outputs.grad = out.grad.data();
    outputs.grad_byte_size = static_cast<int64_t>(out.grad.size());
  }
  outputs.row_kl = out.row_kl.data();
  outputs.row_kl_size = c.num_rows();
  absl::StatusOr<IndexerKlResult> result =
      ComputeIndexerKl(backend, problem, rows, outputs);
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) out.result = *result;
  return out;
}

// Copies rows [begin, end) of one per-row tensor into a block laid out
// [heads, n, row_elements], and returns the view of the copy.
RowView CopyRows(const RowView& whole, int64_t T, int64_t heads,
                 int64_t row_elements, int64_t begin, int64_t end,
                 std::vector<std::byte>& storage) {
  const int64_t n = end - begin;
  const int64_t row_bytes = row_elements * DTypeSize(whole.dtype);
  storage.assign(heads * n * row_bytes, std::byte{0});
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(&storage[(h * n + (r - begin)) * row_bytes],
                  whole.Row(r, T, h), row_bytes);
    }
  }
  RowView view;
  view.dtype = whole.dtype;
  view.data = storage.data();
  view.origin_row = begin;
  view.batch_stride = T * row_elements;
  view.row_stride = row_elements;
  view.head_stride = heads > 1 ? n * row_elements : 0;
  return view;
}

// Computes `problem` with a LossComputation fed blocks (the given
// boundaries, in order; a problem that counts first is fed the counting pass
// in `count_boundaries`), reading the whole tensors (`whole`) or copies of
// each block's rows, and writing into the whole output buffers or into
// buffers of each block's rows.
Outputs RunInBlocks(Backend& backend, const IndexerKlProblem& problem,
                    const RowData& whole, const Case& c,
                    const std::vector<int64_t>& count_boundaries,
                    const std::vector<int64_t>& boundaries, bool copy_rows) {
  Outputs out;
  out.grad.assign(GradBytes(c), std::byte{0xff});
  out.row_kl.assign(c.num_rows(), -1.0);
  const int64_t T = c.T, L = c.slots();
  const int64_t es = DTypeSize(c.options.grad_dtype);
  LossComputation computation(backend, problem);
  // Feeds one block, its rows' tensors copied when `copy_rows`.
  auto feed = [&](RowRange rows, bool counting) {
    absl::StatusOr<AdmittedBlock> block =
        computation.Admit(rows.begin, rows.size(), counting);
    ASSERT_TRUE(block.ok()) << block.status();
    RowData data = whole;
    std::vector<std::byte> target, scores, indices, mask;
    if (copy_rows) {
      data.target =
          CopyRows(whole.target, T, problem.per_head() ? problem.H : 1, L,
                   rows.begin, rows.end, target);
      data.scores =
          CopyRows(whole.scores, T, 1, L, rows.begin, rows.end, scores);
      if (whole.indices.present()) {
        data.indices =
            CopyRows(whole.indices, T, 1, L, rows.begin, rows.end, indices);
      }
      if (whole.mask.present()) {
        data.mask = CopyRows(whole.mask, T, 1, c.S, rows.begin, rows.end, mask);
      }
    }
    std::vector<std::byte> block_grad(rows.size() * L * es, std::byte{0xff});
    std::vector<double> block_row_kl(rows.size(), -1.0);
    LossOutputs outputs;
    if (c.options.want_grad) {
      outputs.grad =
          copy_rows ? block_grad.data() : out.grad.data() + rows.begin * L * es;
      outputs.grad_byte_size = rows.size() * L * es;
    }
    outputs.row_kl =
        copy_rows ? block_row_kl.data() : out.row_kl.data() + rows.begin;
    outputs.row_kl_size = rows.size();
    const absl::Status status = computation.Compute(*block, data, outputs);
    EXPECT_TRUE(status.ok()) << status;
    if (copy_rows && !counting) {
      std::memcpy(&out.grad[rows.begin * L * es], block_grad.data(),
                  block_grad.size());
      std::copy(block_row_kl.begin(), block_row_kl.end(),
                out.row_kl.begin() + rows.begin);
    }
  };
  if (computation.needs_counting()) {
    for (size_t k = 0; k + 1 < count_boundaries.size(); ++k) {
      feed(RowRange{count_boundaries[k], count_boundaries[k + 1]}, true);
    }
  }
  for (size_t k = 0; k + 1 < boundaries.size(); ++k) {
    feed(RowRange{boundaries[k], boundaries[k + 1]}, false);
  }
  absl::StatusOr<IndexerKlResult> result = computation.Finish();
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) out.result = *result;
  return out;
}

uint64_t Bits(double v) { return std::bit_cast<uint64_t>(v); }

void ExpectIdentical(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(Bits(a.result.loss), Bits(b.result.loss))
      << a.result.loss << " vs " << b.result.loss;
  EXPECT_EQ(Bits(a.result.unscaled_loss), Bits(b.result.unscaled_loss));
  EXPECT_EQ(a.result.denominator, b.result.denominator);
  EXPECT_EQ(a.result.rows_counted, b.result.rows_counted);
  EXPECT_EQ(a.result.rows_fully_masked, b.result.rows_fully_masked);
  EXPECT_EQ(a.result.rows_zero_target, b.result.rows_zero_target);
  ASSERT_EQ(a.result.diagnostics.has_value(), b.result.diagnostics.has_value());
  if (a.result.diagnostics) {
    const Diagnostics &x = *a.result.diagnostics, &y = *b.result.diagnostics;
    EXPECT_EQ(Bits(x.mean_entropy_p), Bits(y.mean_entropy_p));
    EXPECT_EQ(Bits(x.mean_entropy_q), Bits(y.mean_entropy_q));
    ASSERT_EQ(x.topk_recall.has_value(), y.topk_recall.has_value());
    if (x.topk_recall) {
      EXPECT_EQ(Bits(*x.topk_recall), Bits(*y.topk_recall));
    }
  }
  for (size_t r = 0; r < a.row_kl.size(); ++r) {
    ASSERT_EQ(Bits(a.row_kl[r]), Bits(b.row_kl[r])) << "row_kl " << r;
  }
  ASSERT_EQ(a.grad.size(), b.grad.size());
  EXPECT_EQ(std::memcmp(a.grad.data(), b.grad.data(), a.grad.size()), 0)
      << "gradient bytes differ";
}

// Random boundaries 0 = b0 < b1 < ... = rows, blocks of 1..max_block rows.
std::vector<int64_t> RandomBoundaries(int64_t rows, int64_t max_block,
                                      std::mt19937_64& rng) {
  std::vector<int64_t> boundaries = {0};
  while (boundaries.back() < rows) {
    const int64_t size = 1 + static_cast<int64_t>(rng() % max_block);
    boundaries.push_back(std::min(rows, boundaries.back() + size));
  }
  return boundaries;
}

std::vector<CaseSpec> BlockSpecs() {
  std::vector<CaseSpec> specs;
  int i = 0;
  for (bool per_head : {true, false}) {
    for (int64_t K : {0, 9}) {
      for (Reduction reduction :
           {Reduction::kMean, Reduction::kMeanValid, Reduction::kSum}) {
        for (bool row_valid : {true, false}) {
          CaseSpec spec;
          spec.B = 3;
          spec.T = 13;
          spec.S = 17;
          spec.form = MakeInputForm(K > 0, per_head);
          spec.H = 3;
          spec.K = K;
          spec.causal = true;
          spec.attention_mask = i % 2 == 0;
          spec.segments = i % 3 == 0;
          spec.row_valid = row_valid;
          spec.target_dtype = i % 3 == 1 ? DType::kBFloat16 : DType::kFloat32;
          spec.scores_dtype = i % 3 == 2 ? DType::kFloat16 : DType::kFloat32;
          spec.options.flavor = i % 2 ? Flavor::kExact : Flavor::kMaxText;
          spec.options.reduction = reduction;
          spec.options.grad_dtype =
              static_cast<DType>(i % 3);  // FP32/BF16/FP16
          spec.options.scaling_factor = 0.01;
          specs.push_back(spec);
          ++i;
        }
      }
    }
  }
  return specs;
}

// The suite runs on every backend (test_backends.h); its helpers compute
// with the backend under test.
class RowBlocks : public BackendTest {};
KLSERVE_INSTANTIATE_ON_BACKENDS(RowBlocks);

TEST_P(RowBlocks, InOrderBlocksReproduceTheWholeProblemBitForBit) {
  std::mt19937_64 rng(99);
  uint64_t seed = 1;
  for (const CaseSpec& spec : BlockSpecs()) {
    SCOPED_TRACE(Describe(spec));
    const Case c = MakeRandomCase(spec, seed++);
    const EncodedCase encoded(c);
    absl::StatusOr<IndexerKlProblem> problem =
        IndexerKlProblem::Create(encoded.inputs(), encoded.options());
    ASSERT_TRUE(problem.ok()) << problem.status();
    const absl::StatusOr<RowData> rows =
        WholeRowData(*problem, encoded.inputs());
    ASSERT_TRUE(rows.ok()) << rows.status();
    const Outputs whole = RunWhole(*backend(), *problem, *rows, c);
    const std::vector<int64_t> one_block = {0, c.num_rows()};
    for (int trial = 0; trial < 3; ++trial) {
      for (bool copy_rows : {false, true}) {
        // Blocks of one row, then of random sizes; the counting pass (when
        // the problem has one) split differently.
        const std::vector<int64_t> boundaries =
            RandomBoundaries(c.num_rows(), trial == 0 ? 1 : 4 + 5 * trial, rng);
        const std::vector<int64_t> count_boundaries =
            trial == 2 ? one_block : RandomBoundaries(c.num_rows(), 7, rng);
        SCOPED_TRACE(std::string(copy_rows ? "copied rows, " : "") +
                     std::to_string(boundaries.size() - 1) + " blocks after " +
                     std::to_string(count_boundaries.size() - 1) +
                     " counting blocks");
        ExpectIdentical(
            whole, RunInBlocks(*backend(), *problem, *rows, c, count_boundaries,
                               boundaries, copy_rows));
      }
    }
    // One block with everything, in both passes.
    ExpectIdentical(whole, RunInBlocks(*backend(), *problem, *rows, c,
                                       one_block, one_block, false));
  }
}

// The CPU backend's own thread counts.
TEST(RowBlocksOnCpu, ThreadCountDoesNotChangeTheBits) {
  CpuBackend one(1, TestIsa()), two(2, TestIsa()), four(4, TestIsa());
  uint64_t seed = 50;
  for (CaseSpec spec : BlockSpecs()) {
    spec.T = 150;  // several chunks per thread
    SCOPED_TRACE(Describe(spec));
    const Case c = MakeRandomCase(spec, seed++);
    const EncodedCase encoded(c);
    absl::StatusOr<IndexerKlProblem> problem =
        IndexerKlProblem::Create(encoded.inputs(), encoded.options());
    ASSERT_TRUE(problem.ok()) << problem.status();
    const absl::StatusOr<RowData> rows =
        WholeRowData(*problem, encoded.inputs());
    ASSERT_TRUE(rows.ok()) << rows.status();
    const Outputs a = RunWhole(one, *problem, *rows, c);
    ExpectIdentical(a, RunWhole(two, *problem, *rows, c));
    ExpectIdentical(a, RunWhole(four, *problem, *rows, c));
    // Blocks alternating between backends, too.
    std::mt19937_64 rng(seed);
    const std::vector<int64_t> boundaries =
        RandomBoundaries(c.num_rows(), 60, rng);
    ExpectIdentical(
        a, RunInBlocks(two, *problem, *rows, c, boundaries, boundaries, true));
  }
}

TEST_P(RowBlocks, ConcurrentCallsOnOneBackendAgree) {
  CaseSpec spec;
  spec.B = 2;
  spec.T = 200;
  spec.S = 33;
  spec.form = InputForm::kSparsePerHead;
  spec.K = 20;
  spec.causal = true;
  const Case c = MakeRandomCase(spec, 7);
  const EncodedCase encoded(c);
  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(encoded.inputs(), encoded.options());
  ASSERT_TRUE(problem.ok()) << problem.status();
  const absl::StatusOr<RowData> rows = WholeRowData(*problem, encoded.inputs());
  ASSERT_TRUE(rows.ok()) << rows.status();
  const Outputs serial = RunWhole(*backend(), *problem, *rows, c);
  std::vector<Outputs> results(4);
  std::vector<std::thread> threads;
  for (Outputs& out : results) {
    threads.emplace_back(
        [&] { out = RunWhole(*backend(), *problem, *rows, c); });
  }
  for (std::thread& t : threads) t.join();
  for (const Outputs& out : results) ExpectIdentical(serial, out);
}

TEST_P(RowBlocks, ErrorInABlockNamesTheTensor) {
  CaseSpec spec;
  spec.B = 2;
  spec.T = 10;
  spec.S = 12;
  spec.form = InputForm::kDenseAggregated;
  Case c = MakeRandomCase(spec, 8);
  c.indexer_scores.values[13 * c.S + 4] = std::nan("");  // row 13
  const EncodedCase encoded(c);
  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(encoded.inputs(), encoded.options());
  ASSERT_TRUE(problem.ok()) << problem.status();
  const absl::StatusOr<RowData> rows = WholeRowData(*problem, encoded.inputs());
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<double> row_kl(c.num_rows());
  BlockOutputs outputs;
  outputs.row_kl = row_kl.data();
  LossAccumulator clean;
  EXPECT_TRUE(
      backend()
          ->ComputeRows(*problem, *rows, RowRange{0, 13}, outputs, clean)
          .ok());
  LossAccumulator dirty;
  outputs.row_kl = row_kl.data() + 10;
  ExpectInvalidStartingWith(
      backend()->ComputeRows(*problem, *rows, RowRange{10, 20}, outputs, dirty),
      {"indexer_scores"});
}

// The passes' order is the computation's to check: a block of the wrong pass
// names `counting`, and a result before every pass is complete names the
// rows.
TEST_P(RowBlocks, BlocksOfTheWrongPassAreRefused) {
  for (bool row_valid : {false, true}) {
    CaseSpec spec;
    spec.B = 2;
    spec.T = 5;
    spec.S = 7;
    spec.row_valid = row_valid;
    spec.options.reduction = Reduction::kMeanValid;
    const Case c = MakeRandomCase(spec, 11);
    const EncodedCase encoded(c);
    absl::StatusOr<IndexerKlProblem> problem =
        IndexerKlProblem::Create(encoded.inputs(), encoded.options());
    ASSERT_TRUE(problem.ok()) << problem.status();
    LossComputation computation(*backend(), *problem);
    // Without row_valid N is counted first.
    EXPECT_EQ(computation.needs_counting(), !row_valid);
    ExpectInvalidStartingWith(computation.Admit(0, 4, row_valid).status(),
                              {"counting"});
    ExpectInvalidStartingWith(computation.Finish().status(),
                              {"row_begin, num_rows"});
    if (!row_valid) {
      ASSERT_TRUE(computation.Admit(0, 10, true).ok());
      // The counting pass is over: the rows come again, not counting.
      ExpectInvalidStartingWith(computation.Admit(0, 10, true).status(),
                                {"counting"});
      // A stream that stopped here is told which pass fell short.
      const absl::Status short_pass = computation.Finish().status();
      ExpectInvalidStartingWith(short_pass, {"row_begin, num_rows"});
      EXPECT_TRUE(absl::StrContains(
          short_pass.message(),
          "the blocks of the gradient pass covered rows [0, 0) of the "
          "B*T=10 rows; after the counting pass, every row comes again"))
          << short_pass;
    }
    ASSERT_TRUE(computation.Admit(0, 4, false).ok());
    ExpectInvalidStartingWith(computation.Admit(5, 5, false).status(),
                              {"row_begin"});
    ExpectInvalidStartingWith(computation.Admit(4, 7, false).status(),
                              {"num_rows"});
  }
}

}  // namespace
}  // namespace klserve::testdata
