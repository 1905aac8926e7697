// The row-range entry point: blocks of rows computed in order (over the
// problem's own tensors or over separately sent copies of the block's rows)
// reproduce the whole-problem call bit for bit, whatever the block sizes,
// thread counts or concurrent callers.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/loss.h"
#include "kernels/loss_accumulator.h"
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
                 const Case& c) {
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
      ComputeIndexerKl(backend, problem, outputs);
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

// Computes `problem` block by block (the given boundaries, in order), with
// its own tensors or with copies of each block's rows, and with a gradient
// buffer of the whole problem or of each block.
Outputs RunInBlocks(Backend& backend, const IndexerKlProblem& problem,
                    const Case& c, const std::vector<int64_t>& boundaries,
                    bool copy_rows) {
  Outputs out;
  out.grad.assign(GradBytes(c), std::byte{0xff});
  out.row_kl.assign(c.num_rows(), -1.0);
  const int64_t T = c.T, L = c.slots();
  const int64_t es = DTypeSize(c.options.grad_dtype);
  // N must be known before the first block for the gradient's scale.
  const bool denominator_known = problem.denominator.has_value();
  const double grad_scale =
      denominator_known ? GradScale(problem, *problem.denominator) : 0;
  LossAccumulator accumulator;
  for (size_t k = 0; k + 1 < boundaries.size(); ++k) {
    const RowRange rows{boundaries[k], boundaries[k + 1]};
    RowData data = problem.rows;
    std::vector<std::byte> target, scores, indices, mask;
    if (copy_rows) {
      data.target =
          CopyRows(problem.rows.target, T, problem.per_head() ? problem.H : 1,
                   L, rows.begin, rows.end, target);
      data.scores =
          CopyRows(problem.rows.scores, T, 1, L, rows.begin, rows.end, scores);
      if (problem.rows.indices.present()) {
        data.indices = CopyRows(problem.rows.indices, T, 1, L, rows.begin,
                                rows.end, indices);
      }
      if (problem.rows.mask.present()) {
        data.mask =
            CopyRows(problem.rows.mask, T, 1, c.S, rows.begin, rows.end, mask);
      }
    }
    std::vector<std::byte> block_grad(rows.size() * L * es);
    BlockOutputs outputs;
    if (c.options.want_grad && denominator_known) {
      outputs.grad_dtype = c.options.grad_dtype;
      outputs.grad_batch_stride = T * L;
      outputs.grad_row_stride = L;
      outputs.grad_scale = grad_scale;
      if (copy_rows) {  // a buffer of the block's rows only
        outputs.grad = block_grad.data();
        outputs.grad_origin_row = rows.begin;
      } else {
        outputs.grad = out.grad.data();
        outputs.grad_origin_row = 0;
      }
    }
    outputs.row_kl = out.row_kl.data() + rows.begin;
    const absl::Status status =
        backend.ComputeRows(problem, data, rows, outputs, accumulator);
    EXPECT_TRUE(status.ok()) << status;
    if (copy_rows && outputs.grad != nullptr) {
      std::memcpy(&out.grad[rows.begin * L * es], block_grad.data(),
                  block_grad.size());
    }
  }
  out.result =
      FinishLoss(problem, accumulator,
                 problem.denominator.value_or(accumulator.rows_nonempty()));
  return out;
}

uint64_t Bits(double v) { return std::bit_cast<uint64_t>(v); }

void ExpectIdentical(const Outputs& a, const Outputs& b, bool compare_grad) {
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
  if (compare_grad) {
    ASSERT_EQ(a.grad.size(), b.grad.size());
    EXPECT_EQ(std::memcmp(a.grad.data(), b.grad.data(), a.grad.size()), 0)
        << "gradient bytes differ";
  }
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
    const Outputs whole = RunWhole(*backend(), *problem, c);
    const bool grad_comparable = problem->denominator.has_value();
    for (int trial = 0; trial < 3; ++trial) {
      for (bool copy_rows : {false, true}) {
        const std::vector<int64_t> boundaries =
            RandomBoundaries(c.num_rows(), trial == 0 ? 1 : 4 + 5 * trial, rng);
        SCOPED_TRACE(std::string(copy_rows ? "copied rows, " : "") +
                     std::to_string(boundaries.size() - 1) + " blocks");
        ExpectIdentical(
            whole, RunInBlocks(*backend(), *problem, c, boundaries, copy_rows),
            grad_comparable);
      }
    }
    // One block with everything.
    ExpectIdentical(
        whole, RunInBlocks(*backend(), *problem, c, {0, c.num_rows()}, false),
        grad_comparable);
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
    const Outputs a = RunWhole(one, *problem, c);
    ExpectIdentical(a, RunWhole(two, *problem, c), true);
    ExpectIdentical(a, RunWhole(four, *problem, c), true);
    // Blocks alternating between backends, too.
    std::mt19937_64 rng(seed);
    const std::vector<int64_t> boundaries =
        RandomBoundaries(c.num_rows(), 60, rng);
    ExpectIdentical(a, RunInBlocks(two, *problem, c, boundaries, true),
                    problem->denominator.has_value());
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
  const Outputs serial = RunWhole(*backend(), *problem, c);
  std::vector<Outputs> results(4);
  std::vector<std::thread> threads;
  for (Outputs& out : results) {
    threads.emplace_back([&] { out = RunWhole(*backend(), *problem, c); });
  }
  for (std::thread& t : threads) t.join();
  for (const Outputs& out : results) ExpectIdentical(serial, out, true);
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
  std::vector<double> row_kl(c.num_rows());
  BlockOutputs outputs;
  outputs.row_kl = row_kl.data();
  LossAccumulator clean;
  EXPECT_TRUE(backend()
                  ->ComputeRows(*problem, problem->rows, RowRange{0, 13},
                                outputs, clean)
                  .ok());
  LossAccumulator dirty;
  outputs.row_kl = row_kl.data() + 10;
  ExpectInvalidStartingWith(
      backend()->ComputeRows(*problem, problem->rows, RowRange{10, 20}, outputs,
                             dirty),
      {"indexer_scores"});
}

}  // namespace
}  // namespace klserve::testdata
