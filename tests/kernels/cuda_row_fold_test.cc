// The CUDA backend's host side of the row results (kernels/cuda/row_fold.h)
// against the CPU backend, on any machine: row results and errors as the
// device would report them, fabricated here, must fold and read exactly as
// the CPU backend's own.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/device_row_result.h"
#include "kernels/cuda/row_fold.h"
#include "kernels/loss_accumulator.h"
#include "kernels/problem.h"
#include "kernels/row_rules.h"
#include "tests/kernels/test_data.h"

namespace klserve {
namespace {

using testdata::Case;
using testdata::CaseSpec;
using testdata::EncodedCase;
using testdata::MakeRandomCase;
using testdata::SharedBackend;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

IndexerKlProblem MakeProblem(const EncodedCase& encoded) {
  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(encoded.inputs(), encoded.options());
  EXPECT_TRUE(problem.ok()) << problem.status();
  return *std::move(problem);
}

// The views of all rows of the request `p` was created from.
RowData MakeRows(const IndexerKlProblem& p, const EncodedCase& encoded) {
  absl::StatusOr<RowData> rows = WholeRowData(p, encoded.inputs());
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? *rows : RowData();
}

// The CPU backend's result for row r alone, as the device reports a row.
cuda::DeviceRowResult CpuRowAsDevice(const IndexerKlProblem& p,
                                     const RowData& rows, int64_t r) {
  LossAccumulator row;
  double kl = kNaN;
  BlockOutputs outputs;
  outputs.row_kl = &kl;
  EXPECT_TRUE(
      SharedBackend().ComputeRows(p, rows, {r, r + 1}, outputs, row).ok());
  cuda::DeviceRowResult d = {};
  d.kind = static_cast<uint8_t>(
      row.rows_fully_masked() > 0  ? RowResult::Kind::kFullyMasked
      : row.rows_zero_target() > 0 ? RowResult::Kind::kZeroTarget
                                   : RowResult::Kind::kComputed);
  d.kl = row.kl_sum();
  d.entropy_p = row.entropy_p_sum();
  d.entropy_q = row.entropy_q_sum();
  d.recall = row.recall_sum();
  return d;
}

TEST(CudaRowFold, FoldsAsTheCpuBackend) {
  CaseSpec spec;
  spec.B = 4;
  spec.T = 8;
  spec.S = 16;
  spec.causal = true;
  spec.q_offset = -2;  // rows with no valid key
  spec.key_padding = true;
  spec.row_valid = true;
  spec.form = InputForm::kDenseAggregated;
  spec.zero_weight_fraction = 0.5;
  const Case c = MakeRandomCase(spec, 7);
  // Each row's own result from a problem without row_valid (which hides the
  // KL of the rows it excludes); the fold must apply row_valid itself.
  Case all_rows = c;
  all_rows.row_valid.reset();
  const EncodedCase encoded_all(all_rows);
  const IndexerKlProblem unmasked = MakeProblem(encoded_all);
  const RowData unmasked_rows = MakeRows(unmasked, encoded_all);
  std::vector<cuda::DeviceRowResult> device_rows;
  for (int64_t r = 0; r < c.num_rows(); ++r) {
    device_rows.push_back(CpuRowAsDevice(unmasked, unmasked_rows, r));
  }

  const EncodedCase encoded(c);
  const IndexerKlProblem p = MakeProblem(encoded);
  const int64_t first = 2;  // a block that starts mid-batch
  const RowRange rows{first, c.num_rows()};
  LossAccumulator cpu, gpu;
  std::vector<double> cpu_kl(rows.size(), kNaN), gpu_kl(rows.size(), kNaN);
  BlockOutputs outputs;
  outputs.row_kl = cpu_kl.data();
  ASSERT_TRUE(SharedBackend()
                  .ComputeRows(p, MakeRows(p, encoded), rows, outputs, cpu)
                  .ok());
  cuda::FoldRows(p, first, absl::MakeConstSpan(device_rows).subspan(first),
                 gpu_kl.data(), gpu);

  EXPECT_EQ(gpu.kl_sum(), cpu.kl_sum());
  EXPECT_EQ(gpu.entropy_p_sum(), cpu.entropy_p_sum());
  EXPECT_EQ(gpu.entropy_q_sum(), cpu.entropy_q_sum());
  EXPECT_EQ(gpu.recall_sum(), cpu.recall_sum());
  EXPECT_EQ(gpu.rows_counted(), cpu.rows_counted());
  EXPECT_EQ(gpu.rows_nonempty(), cpu.rows_nonempty());
  EXPECT_EQ(gpu.rows_fully_masked(), cpu.rows_fully_masked());
  EXPECT_EQ(gpu.rows_zero_target(), cpu.rows_zero_target());
  EXPECT_EQ(gpu_kl, cpu_kl);
  // The case exercises every kind of row and both row_valid values.
  EXPECT_GT(cpu.rows_fully_masked(), 0);
  EXPECT_GT(cpu.rows_zero_target(), 0);
  EXPECT_GT(cpu.rows_counted(), 0);
  EXPECT_LT(cpu.rows_counted(), cpu.rows_nonempty());
}

// One bad value planted in row (b = 1, t = 0) of a 2 x 2 problem, and the
// error the device reports for it.
struct PlantedError {
  const char* name;
  InputForm form;  // a dense one
  DType target_dtype;
  Flavor flavor;
  void (*plant)(Case& c);
  RowError error;
  int64_t head;
  int64_t slot;
};

constexpr int64_t kB = 1, kT = 0, kRow = kB * 2 + kT;

const PlantedError kPlanted[] = {
    {"LogitNaN", InputForm::kDensePerHead, DType::kBFloat16, Flavor::kExact,
     [](Case& c) {
       c.attention_logits->at({kB, 1, kT, 5}) = kNaN;
     },
     RowError::kLogitsNotFinite, 1, 5},
    {"LogitsAllMinusInf", InputForm::kDensePerHead, DType::kFloat32,
     Flavor::kMaxText,
     [](Case& c) {
       for (int64_t s = 0; s < c.S; ++s) {
         c.attention_logits->at({kB, 1, kT, s}) = -kInf;
       }
     },
     RowError::kLogitsAllMinusInf, 1, 0},
    {"WeightNegative", InputForm::kDenseAggregated, DType::kFloat16,
     Flavor::kExact,
     [](Case& c) {
       c.attention_weights->at({kB, kT, 3}) = -0.5;
     },
     RowError::kWeightsBad, 0, 3},
    {"ScorePlusInf", InputForm::kDenseAggregated, DType::kFloat32,
     Flavor::kExact,
     [](Case& c) {
       c.indexer_scores.at({kB, kT, 6}) = kInf;
     },
     RowError::kScoresNotFinite, 0, 6},
    {"ScoresAllMinusInf", InputForm::kDensePerHead, DType::kFloat32,
     Flavor::kMaxText,
     [](Case& c) {
       for (int64_t s = 0; s < c.S; ++s) {
         c.indexer_scores.at({kB, kT, s}) = -kInf;
       }
     },
     RowError::kScoresAllMinusInf, 0, 0},
    {"MinusInfWithMass", InputForm::kDenseAggregated, DType::kFloat32,
     Flavor::kExact,
     [](Case& c) {
       c.indexer_scores.at({kB, kT, 2}) = -kInf;
     },
     RowError::kMinusInfWithMass, 0, 2},
};

class CudaRowError : public ::testing::TestWithParam<PlantedError> {};

TEST_P(CudaRowError, WordedAsTheCpuBackend) {
  const PlantedError& planted = GetParam();
  CaseSpec spec;
  spec.B = 2;
  spec.T = 2;
  spec.S = 8;
  spec.form = planted.form;
  spec.target_dtype = planted.target_dtype;
  spec.zero_weight_fraction = 0;  // mass at every key
  spec.options.flavor = planted.flavor;
  Case c = MakeRandomCase(spec, 11);
  planted.plant(c);
  const EncodedCase encoded(c);
  const IndexerKlProblem p = MakeProblem(encoded);
  const RowData rows = MakeRows(p, encoded);

  LossAccumulator accumulator;
  const absl::Status cpu = SharedBackend().ComputeRows(
      p, rows, {0, c.num_rows()}, BlockOutputs{}, accumulator);
  ASSERT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;

  std::vector<cuda::DeviceRowResult> device_rows(c.num_rows());
  device_rows[kRow].error = static_cast<uint8_t>(planted.error);
  device_rows[kRow].error_head = static_cast<int32_t>(planted.head);
  device_rows[kRow].error_slot = planted.slot;
  EXPECT_EQ(cuda::FirstRowError(p, rows, 0, device_rows), cpu);
}

INSTANTIATE_TEST_SUITE_P(
    Errors, CudaRowError, ::testing::ValuesIn(kPlanted),
    [](const ::testing::TestParamInfo<PlantedError>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace klserve
