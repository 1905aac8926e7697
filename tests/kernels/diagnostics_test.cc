// The optional diagnostics (entropies of p and q, top-k recall, row counts)
// against the reference and a few values worked by hand.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"

namespace klserve::testdata {
namespace {

// One row, aggregated target, SUM reduction.
Case OneRow(std::vector<double> weights, std::vector<double> scores) {
  Case c;
  c.B = 1;
  c.T = 1;
  c.S = static_cast<int64_t>(scores.size());
  c.attention_weights = HostTensor(DType::kFloat32, {1, 1, c.S});
  c.attention_weights->values = std::move(weights);
  c.indexer_scores = HostTensor(DType::kFloat32, {1, 1, c.S});
  c.indexer_scores.values = std::move(scores);
  c.options.reduction = Reduction::kSum;
  c.options.want_diagnostics = true;
  return c;
}

// The suite runs on every backend (test_backends.h); its helpers compute
// with the backend under test. (Its name hides klserve::Diagnostics here.)
class Diagnostics : public BackendTest {};
KLSERVE_INSTANTIATE_ON_BACKENDS(Diagnostics);

TEST_P(Diagnostics, MatchReferenceForSeveralRecallK) {
  std::mt19937_64 rng(77);
  uint64_t seed = 1;
  for (int i = 0; i < 60; ++i) {
    CaseSpec spec = RandomSpec(rng);
    // Float32 scores: no ties at the recall boundary.
    spec.scores_dtype = DType::kFloat32;
    spec.zero_weight_fraction = 0.4;
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{5}, spec.S + 10}) {
      spec.options.want_diagnostics = true;
      spec.options.recall_k = k;
      SCOPED_TRACE(Describe(spec));
      const klref::RefResult ref =
          CheckAgainstReference(MakeRandomCase(spec, seed++));
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_FALSE(ref.recall_tie);
    }
  }
}

TEST_P(Diagnostics, HandComputedEntropiesAndRecall) {
  // p = (0.1, 0.2, 0.7); the scores rank keys 2, 0, 1.
  Case c = OneRow({1, 2, 7}, {1, 0, 2});
  const double z = std::exp(1.0) + 1 + std::exp(2.0);
  const double q[] = {std::exp(1.0) / z, 1 / z, std::exp(2.0) / z};
  double hq = 0;
  for (double x : q) hq -= x * std::log(x);
  const double hp =
      -(0.1 * std::log(0.1) + 0.2 * std::log(0.2) + 0.7 * std::log(0.7));
  for (auto [k, want] : {std::pair{int64_t{1}, 0.7},
                         {int64_t{2}, 0.8},
                         {int64_t{3}, 1.0},
                         {int64_t{100}, 1.0}}) {
    c.options.recall_k = k;
    const LibOutput lib = RunLibrary(c);
    ASSERT_TRUE(lib.status.ok()) << lib.status;
    ASSERT_TRUE(lib.result.diagnostics.has_value());
    const klserve::Diagnostics& d = *lib.result.diagnostics;
    EXPECT_NEAR(d.mean_entropy_p, hp, 1e-6);
    EXPECT_NEAR(d.mean_entropy_q, hq, 1e-6);
    ASSERT_TRUE(d.topk_recall.has_value());
    EXPECT_NEAR(*d.topk_recall, want, 1e-6) << "k=" << k;
  }
}

TEST_P(Diagnostics, RecallTiesGoToTheLowerKey) {
  // Equal scores: the first keys win.
  Case c = OneRow({1, 2, 3}, {0, 0, 0});
  for (auto [k, want] : {std::pair{int64_t{1}, 1.0 / 6}, {int64_t{2}, 0.5}}) {
    c.options.recall_k = k;
    const LibOutput lib = RunLibrary(c);
    ASSERT_TRUE(lib.status.ok()) << lib.status;
    ASSERT_TRUE(lib.result.diagnostics.has_value());
    ASSERT_TRUE(lib.result.diagnostics->topk_recall.has_value());
    EXPECT_NEAR(*lib.result.diagnostics->topk_recall, want, 1e-6);
  }
}

TEST_P(Diagnostics, SparseRecallTiesGoToTheLowerKeyInAnySlotOrder) {
  // Keys 0, 1, 2 carry 0.7, 0.2, 0.1 of the target and equal scores (as
  // relu leaves many): the slots' order, which the client chooses, must not
  // change which keys win the tie (it did: 0.7 in one order, 0.1 reversed).
  if (GetParam() == "cuda") {
    GTEST_SKIP() << "the device breaks recall ties by slot (docs/cuda.md)";
  }
  const double mass[] = {0.7, 0.2, 0.1};
  std::vector<int32_t> keys = {0, 1, 2};
  do {
    Case c;
    c.B = 1, c.T = 1, c.S = 3, c.K = 3;
    c.options.num_keys = 3;
    c.options.reduction = Reduction::kSum;
    c.options.want_diagnostics = true;
    c.attention_weights = HostTensor(DType::kFloat32, {1, 1, 3});
    c.topk_indices = HostTensor(DType::kInt32, {1, 1, 3});
    c.indexer_scores = HostTensor(DType::kFloat32, {1, 1, 3});
    for (int s = 0; s < 3; ++s) {
      c.attention_weights->values[s] = mass[keys[s]];
      c.topk_indices->values[s] = keys[s];
      c.indexer_scores.values[s] = 0;
    }
    for (auto [k, want] : {std::pair{int64_t{1}, 0.7}, {int64_t{2}, 0.9}}) {
      c.options.recall_k = k;
      const LibOutput lib = RunLibrary(c);
      ASSERT_TRUE(lib.status.ok()) << lib.status;
      ASSERT_TRUE(lib.result.diagnostics->topk_recall.has_value());
      EXPECT_NEAR(*lib.result.diagnostics->topk_recall, want, 1e-6)
          << "k=" << k << ", slots name keys " << keys[0] << keys[1] << keys[2];
    }
  } while (std::next_permutation(keys.begin(), keys.end()));
}

TEST_P(Diagnostics, RecallCountsOnlyValidKeys) {
  // The best-scored key is masked out; recall over the valid keys only.
  Case c = OneRow({1, 2, 7, 100}, {1, 0, 2, 50});
  c.key_padding_mask = HostTensor(DType::kBool, {1, 4}, 1);
  c.key_padding_mask->values[3] = 0;
  c.options.recall_k = 1;
  CheckAgainstReference(c);
  const LibOutput lib = RunLibrary(c);
  ASSERT_TRUE(lib.status.ok());
  EXPECT_NEAR(*lib.result.diagnostics->topk_recall, 0.7, 1e-6);
}

TEST_P(Diagnostics, AbsentUnlessRequestedAndRecallAbsentForKZero) {
  Case c = OneRow({1, 2, 7}, {1, 0, 2});
  c.options.want_diagnostics = false;
  c.options.recall_k = 2;
  LibOutput lib = RunLibrary(c);
  ASSERT_TRUE(lib.status.ok()) << lib.status;
  EXPECT_FALSE(lib.result.diagnostics.has_value());

  c.options.want_diagnostics = true;
  c.options.recall_k = 0;
  lib = RunLibrary(c);
  ASSERT_TRUE(lib.status.ok()) << lib.status;
  ASSERT_TRUE(lib.result.diagnostics.has_value());
  EXPECT_FALSE(lib.result.diagnostics->topk_recall.has_value());
}

TEST_P(Diagnostics, RowCountsWithRowValid) {
  // Fully masked, zero-target and computed rows, some of them dropped by
  // row_valid: counts against the reference (which counts fully masked and
  // zero-target rows whatever row_valid says).
  Case c;
  c.B = 1;
  c.T = 6;
  c.S = 3;
  c.attention_weights = HostTensor(DType::kFloat32, {1, 6, 3}, 1.0);
  c.indexer_scores = HostTensor(DType::kFloat32, {1, 6, 3}, 0.5);
  c.attention_mask = HostTensor(DType::kBool, {1, 6, 3}, 1);
  for (int64_t s = 0; s < 3; ++s) {
    c.attention_mask->at({0, 0, s}) = 0;  // rows 0 and 1 fully masked
    c.attention_mask->at({0, 1, s}) = 0;
    c.attention_weights->at({0, 2, s}) = 0;  // rows 2 and 3 zero target
    c.attention_weights->at({0, 3, s}) = 0;
  }
  c.indexer_scores.at({0, 4, 0}) = 3;
  c.row_valid = HostTensor(DType::kBool, {1, 6}, 1);
  c.row_valid->values = {0, 1, 0, 1, 0, 1};
  c.options.want_diagnostics = true;
  c.options.want_row_kl = true;
  c.options.recall_k = 1;
  for (Reduction reduction :
       {Reduction::kMean, Reduction::kMeanValid, Reduction::kSum}) {
    c.options.reduction = reduction;
    const klref::RefResult ref = CheckAgainstReference(c);
    EXPECT_EQ(ref.rows_fully_masked, 2);
    EXPECT_EQ(ref.rows_zero_target, 2);
    EXPECT_EQ(ref.rows_counted, 1);
  }
  // Without row_valid, MEAN_VALID counts the two computed rows.
  c.row_valid.reset();
  c.options.reduction = Reduction::kMeanValid;
  const klref::RefResult ref = CheckAgainstReference(c);
  EXPECT_EQ(ref.denominator, 2);
}

TEST_P(Diagnostics, NothingCountedGivesZeros) {
  Case c = OneRow({1, 2, 7}, {1, 0, 2});
  c.key_padding_mask = HostTensor(DType::kBool, {1, 3}, 0);
  c.options.recall_k = 2;
  const LibOutput lib = RunLibrary(c);
  ASSERT_TRUE(lib.status.ok()) << lib.status;
  EXPECT_EQ(lib.result.rows_counted, 0);
  EXPECT_EQ(lib.result.rows_fully_masked, 1);
  ASSERT_TRUE(lib.result.diagnostics.has_value());
  EXPECT_EQ(lib.result.diagnostics->mean_entropy_p, 0);
  EXPECT_EQ(lib.result.diagnostics->mean_entropy_q, 0);
  ASSERT_TRUE(lib.result.diagnostics->topk_recall.has_value());
  EXPECT_EQ(*lib.result.diagnostics->topk_recall, 0);
}

// Without diagnostics a MAXTEXT row sums only its target's weights, where
// with them (and in EXACT) it also sums their logs for the entropy of p. The
// loss, the gradient and the row KL must come out the same to the bit
// either way, and match the reference without diagnostics too.
TEST_P(Diagnostics, AskingForThemChangesNoBitOfTheLoss) {
  std::mt19937_64 rng(91);
  uint64_t seed = 900;
  const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
  const auto same = [&](const Case& plain) {
    Case asking = plain;
    asking.options.want_diagnostics = true;
    const LibOutput a = RunLibrary(plain), b = RunLibrary(asking);
    ASSERT_TRUE(a.status.ok()) << a.status;
    ASSERT_TRUE(b.status.ok()) << b.status;
    EXPECT_EQ(bits(a.result.loss), bits(b.result.loss));
    EXPECT_EQ(a.grad_bytes, b.grad_bytes);
    ASSERT_EQ(a.row_kl.size(), b.row_kl.size());
    for (size_t i = 0; i < a.row_kl.size(); ++i) {
      ASSERT_EQ(bits(a.row_kl[i]), bits(b.row_kl[i])) << "row " << i;
    }
  };
  for (int i = 0; i < 48; ++i) {
    CaseSpec spec = RandomSpec(rng);
    spec.options.want_diagnostics = false;
    for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
      spec.options.flavor = flavor;
      SCOPED_TRACE(Describe(spec));
      const Case plain = MakeRandomCase(spec, seed);
      CheckAgainstReference(plain);
      same(plain);
    }
    ++seed;
  }
  // Subnormal weights, which the scan with logs takes in a pass of its own,
  // beside a few normal weights per row, or alone (MAXTEXT's epsilon keeps
  // Z above 1e-8 there); and rows whose weights sum past 2^100, which are
  // rescaled by a power of two and, with diagnostics, scanned again.
  const std::function<double(size_t)> weights[] = {
      [](size_t j) {
        return j % 50 == 7 ? 1e-3 : 1e-40 * static_cast<double>(1 + j % 5);
      },
      [](size_t j) { return 1e-42 * static_cast<double>(1 + j % 5); },
      [](size_t j) { return 1e37 * static_cast<double>(1 + j % 5); },
  };
  for (const auto& weight : weights) {
    for (InputForm form :
         {InputForm::kDenseAggregated, InputForm::kSparseAggregated}) {
      CaseSpec spec;
      spec.form = form;
      spec.T = 3;
      spec.S = 300;
      spec.K = form == InputForm::kSparseAggregated ? 200 : 0;
      spec.options.flavor = Flavor::kMaxText;
      spec.options.want_diagnostics = false;
      SCOPED_TRACE(Describe(spec));
      Case c = MakeRandomCase(spec, seed++);
      std::vector<double>& w = c.attention_weights->values;
      for (size_t j = 0; j < w.size(); ++j) w[j] = weight(j);
      CheckAgainstReference(c);
      same(c);
    }
  }
}

}  // namespace
}  // namespace klserve::testdata
