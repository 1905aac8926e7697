// The worked invariants at the end of the spec, on the library alone or
// against itself: KL >= 0, KL = 0 at q = p, sparse with every key equals
// dense, slot permutations, identical heads equal the aggregated form, fully
// masked rows, 16-bit inputs. (Finite differences: gradient_check_test.cc.)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/problem.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klserve::testdata {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Expects two library outputs to agree to float32 rounding.
void ExpectSameOutputs(const LibOutput& a, const LibOutput& b,
                       double rel = 2e-6) {
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_NEAR(a.result.loss, b.result.loss,
              rel * std::fabs(a.result.loss) + 1e-12);
  EXPECT_EQ(a.result.denominator, b.result.denominator);
  EXPECT_EQ(a.result.rows_counted, b.result.rows_counted);
  EXPECT_EQ(a.result.rows_fully_masked, b.result.rows_fully_masked);
  EXPECT_EQ(a.result.rows_zero_target, b.result.rows_zero_target);
  ASSERT_EQ(a.row_kl.size(), b.row_kl.size());
  for (size_t i = 0; i < a.row_kl.size(); ++i) {
    EXPECT_NEAR(a.row_kl[i], b.row_kl[i], rel * std::fabs(a.row_kl[i]) + 1e-7)
        << "row " << i;
  }
  ASSERT_EQ(a.grad.size(), b.grad.size());
  const double tol = rel * 10 * MaxAbs(a.grad) + 1e-12;
  for (size_t i = 0; i < a.grad.size(); ++i) {
    ASSERT_NEAR(a.grad[i], b.grad[i], tol) << "grad " << i;
  }
}

// The suite runs on every backend (test_backends.h); its helpers compute
// with the backend under test.
class Invariants : public BackendTest {};
KLSERVE_INSTANTIATE_ON_BACKENDS(Invariants);

TEST_P(Invariants, KlIsNonNegative) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 120; ++i) {
    CaseSpec spec = RandomSpec(rng);
    spec.options.scaling_factor = 1;
    // MaxText's epsilon can make its KL slightly negative (a row with one
    // key of weight w has p = w / (w + 1e-8) < q = 1); the invariant is the
    // exact KL's.
    spec.options.flavor = Flavor::kExact;
    SCOPED_TRACE(Describe(spec));
    const LibOutput lib = RunLibrary(MakeRandomCase(spec, 300 + i));
    ASSERT_TRUE(lib.status.ok()) << lib.status;
    EXPECT_GE(lib.result.loss, -1e-7);
    for (double kl : lib.row_kl) ASSERT_GE(kl, -1e-6);
  }
}

TEST_P(Invariants, KlIsZeroWhenTheIndexerReproducesTheTarget) {
  uint64_t seed = 21;
  for (bool sparse : {false, true}) {
    for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
      // One head, scores = scale * logits: q is exactly the target.
      CaseSpec spec;
      spec.B = 2;
      spec.T = 5;
      spec.S = 9;
      spec.form = MakeInputForm(sparse, /*per_head=*/true);
      spec.H = 1;
      spec.K = 7;
      spec.causal = true;
      spec.options.flavor = flavor;
      spec.options.reduction = Reduction::kSum;
      spec.options.softmax_scale = 0.5f;
      Case c = MakeRandomCase(spec, seed++);
      for (size_t i = 0; i < c.indexer_scores.values.size(); ++i) {
        c.indexer_scores.values[i] = 0.5 * c.attention_logits->values[i];
      }
      const LibOutput lib = RunLibrary(c);
      ASSERT_TRUE(lib.status.ok()) << lib.status;
      EXPECT_NEAR(lib.result.loss, 0, 1e-6);
      for (double kl : lib.row_kl) EXPECT_NEAR(kl, 0, 1e-6);
      for (double g : lib.grad) ASSERT_NEAR(g, 0, 1e-6);

      // Aggregated: scores = log(weights), -inf where the weight is 0 (no
      // scale: it applies to logits only).
      spec.form = MakeInputForm(sparse, /*per_head=*/false);
      spec.options.softmax_scale = 1.0f;
      spec.zero_weight_fraction = 0.3;
      c = MakeRandomCase(spec, seed++);
      const klref::RefResult ref = klref::ComputeReference(ToReference(c));
      const int64_t L = c.slots();
      for (int64_t r = 0; r < c.num_rows(); ++r) {
        bool first = true;  // keep one positive weight per row
        for (int64_t j = 0; j < L; ++j) {
          const int64_t i = r * L + j;
          if (!ref.valid[i]) continue;
          double& w = c.attention_weights->values[i];
          if (first && w == 0) w = 0.25;
          first = false;
          c.indexer_scores.values[i] = std::log(w);
        }
      }
      const LibOutput agg = RunLibrary(c);
      ASSERT_TRUE(agg.status.ok()) << agg.status;
      EXPECT_NEAR(agg.result.loss, 0, 1e-6);
      for (double kl : agg.row_kl) EXPECT_NEAR(kl, 0, 1e-6);
      for (double g : agg.grad) ASSERT_NEAR(g, 0, 1e-6);
    }
  }
}

// The dense case as a sparse one: K slots naming `keys` per row (the same
// list for every row), with the per-slot tensors gathered.
Case AsSparse(const Case& dense, const std::vector<int64_t>& keys) {
  Case c = dense;
  const int64_t B = dense.B, T = dense.T, S = dense.S;
  const int64_t K = static_cast<int64_t>(keys.size());
  c.K = K;
  c.options.num_keys = S;
  c.topk_indices = HostTensor(DType::kInt32, {B, T, K});
  c.indexer_scores = HostTensor(dense.indexer_scores.dtype, {B, T, K});
  if (dense.attention_logits) {
    c.attention_logits =
        HostTensor(dense.attention_logits->dtype, {B, dense.H, T, K});
  } else {
    c.attention_weights = HostTensor(dense.attention_weights->dtype, {B, T, K});
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = keys[j];
        const bool empty = s < 0 || s >= S;  // names no key
        c.topk_indices->at({b, t, j}) = s;
        c.indexer_scores.at({b, t, j}) =
            empty ? -kInf : dense.indexer_scores.at({b, t, s});
        if (dense.attention_logits) {
          for (int64_t h = 0; h < dense.H; ++h) {
            c.attention_logits->at({b, h, t, j}) =
                empty ? 0.0 : dense.attention_logits->at({b, h, t, s});
          }
        } else {
          c.attention_weights->at({b, t, j}) =
              empty ? 7.0 : dense.attention_weights->at({b, t, s});
        }
      }
    }
  }
  return c;
}

// Ten slots in the sparse forms.
CaseSpec MaskedSpec(InputForm form, int variant) {
  CaseSpec spec;
  spec.B = 2;
  spec.T = 7;
  spec.S = 13;
  spec.form = form;
  spec.K = 10;
  spec.H = 3;
  spec.causal = variant % 2 == 0;
  spec.segments = variant % 3 == 0;
  spec.attention_mask = variant % 4 == 1;
  spec.key_padding = variant % 5 == 2;
  spec.row_valid = variant % 3 == 1;
  spec.options.flavor = variant % 2 == 0 ? Flavor::kExact : Flavor::kMaxText;
  spec.options.reduction = static_cast<Reduction>(variant % 3);
  return spec;
}

TEST_P(Invariants, SparseWithEveryKeyEqualsDense) {
  uint64_t seed = 31;
  for (InputForm form :
       {InputForm::kDensePerHead, InputForm::kDenseAggregated}) {
    for (int variant = 0; variant < 8; ++variant) {
      const CaseSpec spec = MaskedSpec(form, variant);
      SCOPED_TRACE(Describe(spec));
      const Case dense = MakeRandomCase(spec, seed++);
      std::vector<int64_t> keys(dense.S);
      std::iota(keys.begin(), keys.end(), 0);
      const LibOutput a = RunLibrary(dense);
      ExpectSameOutputs(a, RunLibrary(AsSparse(dense, keys)));
      // Extra empty slots change nothing but the layout, whichever index
      // outside [0, S) marks them, repeated or not.
      keys.push_back(-1);
      keys.insert(keys.begin() + 3, -1);
      keys.insert(keys.begin() + 1, dense.S);
      keys.insert(keys.begin() + 5, std::numeric_limits<int32_t>::min());
      keys.push_back(dense.S);
      keys.push_back(std::numeric_limits<int32_t>::max());
      keys.push_back(-2);
      const LibOutput b = RunLibrary(AsSparse(dense, keys));
      ASSERT_TRUE(b.status.ok()) << b.status;
      EXPECT_NEAR(a.result.loss, b.result.loss,
                  2e-6 * std::fabs(a.result.loss) + 1e-12);
    }
  }
}

TEST_P(Invariants, PermutingSlotsPermutesTheGradient) {
  uint64_t seed = 41;
  std::mt19937_64 rng(5);
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    for (int variant = 0; variant < 8; ++variant) {
      const CaseSpec spec = MaskedSpec(form, variant);
      SCOPED_TRACE(Describe(spec));
      const Case c = MakeRandomCase(spec, seed++);
      // Permute every row's slots with its own permutation.
      Case permuted = c;
      const int64_t K = c.K, rows = c.num_rows();
      std::vector<std::vector<int64_t>> perms(rows);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t>& perm = perms[r];
        perm.resize(K);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const int64_t b = r / c.T, t = r % c.T;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t from = perm[j];
          permuted.topk_indices->at({b, t, j}) =
              c.topk_indices->at({b, t, from});
          permuted.indexer_scores.at({b, t, j}) =
              c.indexer_scores.at({b, t, from});
          if (IsPerHead(form)) {
            for (int64_t h = 0; h < c.H; ++h) {
              permuted.attention_logits->at({b, h, t, j}) =
                  c.attention_logits->at({b, h, t, from});
            }
          } else {
            permuted.attention_weights->at({b, t, j}) =
                c.attention_weights->at({b, t, from});
          }
        }
      }
      const LibOutput a = RunLibrary(c), b = RunLibrary(permuted);
      ASSERT_TRUE(a.status.ok()) << a.status;
      ASSERT_TRUE(b.status.ok()) << b.status;
      EXPECT_NEAR(a.result.loss, b.result.loss,
                  2e-6 * std::fabs(a.result.loss) + 1e-12);
      const double tol = 2e-5 * MaxAbs(a.grad) + 1e-12;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < K; ++j) {
          ASSERT_NEAR(b.grad[r * K + j], a.grad[r * K + perms[r][j]], tol)
              << "row " << r << " slot " << j;
        }
      }
    }
  }
}

TEST_P(Invariants, IdenticalHeadsEqualTheAggregatedForm) {
  uint64_t seed = 51;
  for (InputForm form : {InputForm::kDensePerHead, InputForm::kSparsePerHead}) {
    for (int variant = 0; variant < 6; ++variant) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        CaseSpec spec = MaskedSpec(form, variant);
        spec.H = 1;
        spec.K = 9;
        spec.target_dtype = dtype;
        spec.options.softmax_scale = 0.75f;
        SCOPED_TRACE(Describe(spec));
        const Case one = MakeRandomCase(spec, seed++);
        const klref::RefResult ref = klref::ComputeReference(ToReference(one));
        ASSERT_EQ(ref.error, "");
        const int64_t H = 5, L = one.slots();

        // H copies of the single head.
        Case heads = one;
        heads.H = H;
        heads.attention_logits = HostTensor(dtype, {one.B, H, one.T, L});
        for (int64_t b = 0; b < one.B; ++b) {
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t t = 0; t < one.T; ++t) {
              for (int64_t j = 0; j < L; ++j) {
                heads.attention_logits->at({b, h, t, j}) =
                    one.attention_logits->at({b, 0, t, j});
              }
            }
          }
        }
        // Aggregated: exp(scale * A - max), computed from the values the
        // library sees, 0 at invalid slots.
        Case agg = one;
        agg.H = 0;
        agg.options.softmax_scale = 1.0f;  // the weights come scaled
        agg.attention_logits.reset();
        agg.attention_weights = HostTensor(DType::kFloat32, {one.B, one.T, L});
        const klref::RefProblem decoded = ToReference(one);
        for (int64_t r = 0; r < one.num_rows(); ++r) {
          const int64_t b = r / one.T, t = r % one.T;
          double m = -kInf;
          for (int64_t j = 0; j < L; ++j) {
            if (ref.valid[r * L + j]) {
              m = std::max(m, 0.75 * decoded.logits[r * L + j]);
            }
          }
          for (int64_t j = 0; j < L; ++j) {
            agg.attention_weights->at({b, t, j}) =
                ref.valid[r * L + j]
                    ? std::exp(0.75 * decoded.logits[r * L + j] - m)
                    : 0.0;
          }
        }
        const LibOutput a = RunLibrary(heads), b = RunLibrary(agg);
        ExpectSameOutputs(a, b, 1e-5);
      }
    }
  }
}

// A case where rows are fully masked in several ways: the first rows by a
// negative causal offset, the whole second batch by key padding.
Case FullyMaskedRowsCase(InputForm form, int64_t K, DType target, DType scores,
                         uint64_t seed) {
  CaseSpec spec;
  spec.B = 2;
  spec.T = 6;
  spec.S = 7;
  spec.form = form;
  spec.H = 2;
  spec.K = K;
  spec.target_dtype = target;
  spec.scores_dtype = scores;
  spec.causal = true;
  spec.q_offset = -2;
  Case c = MakeRandomCase(spec, seed);
  c.key_padding_mask = HostTensor(DType::kBool, {2, c.S}, 1);
  for (int64_t s = 0; s < c.S; ++s) c.key_padding_mask->at({1, s}) = 0;
  // Garbage everywhere in the masked batch: the worst legal values.
  const double big = scores == DType::kFloat16 ? 6e4 : 3e38;
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.slots(); ++j) {
      c.indexer_scores.at({1, t, j}) = (j % 2 == 0) ? -kInf : big;
      if (IsPerHead(form)) {
        c.attention_logits->at({1, 0, t, j}) = -kInf;
        c.attention_logits->at({1, 1, t, j}) = j % 3 == 0 ? -kInf : -big;
      } else {
        c.attention_weights->at({1, t, j}) = j % 2 == 0 ? 0.0 : 1e4;
      }
    }
  }
  return c;
}

TEST_P(Invariants, FullyMaskedRowsAreZeroUnderEveryDtype) {
  uint64_t seed = 61;
  const DType floats[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (InputForm form : kInputFormsByTarget) {
    for (DType dtype : floats) {
      for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
        Case c = FullyMaskedRowsCase(form, 5, dtype, dtype, seed++);
        c.options.flavor = flavor;
        c.options.grad_dtype = floats[seed % 3];
        SCOPED_TRACE(std::string(InputFormName(form)) + " dtype " +
                     std::string(DTypeName(dtype)));
        const klref::RefResult ref = CheckAgainstReference(c);
        ASSERT_EQ(ref.error, "");
        EXPECT_GE(ref.rows_fully_masked, 8);
        const LibOutput lib = RunLibrary(c);
        ASSERT_TRUE(lib.status.ok()) << lib.status;
        const int64_t L = c.slots();
        for (int64_t r = 0; r < c.num_rows(); ++r) {
          bool any_valid = false;
          for (int64_t j = 0; j < L; ++j) any_valid |= ref.valid[r * L + j];
          if (any_valid) continue;
          EXPECT_EQ(lib.row_kl[r], 0) << "row " << r;
          for (int64_t j = 0; j < L; ++j) {
            ASSERT_EQ(lib.grad[r * L + j], 0) << "row " << r;
          }
        }
      }
    }
  }
}

TEST_P(Invariants, EveryRowFullyMaskedGivesZerosAndNoNan) {
  uint64_t seed = 71;
  for (InputForm form : kInputFormsByTarget) {
    for (Reduction reduction :
         {Reduction::kMean, Reduction::kMeanValid, Reduction::kSum}) {
      Case c = FullyMaskedRowsCase(form, 4, DType::kFloat32, DType::kBFloat16,
                                   seed++);
      for (double& v : c.key_padding_mask->values) v = 0;
      c.options.reduction = reduction;
      c.options.recall_k = 2;
      const LibOutput lib = RunLibrary(c);
      ASSERT_TRUE(lib.status.ok()) << lib.status;
      EXPECT_EQ(lib.result.loss, 0);
      EXPECT_EQ(lib.result.unscaled_loss, 0);
      EXPECT_EQ(lib.result.rows_counted, 0);
      EXPECT_EQ(lib.result.rows_fully_masked, c.num_rows());
      EXPECT_EQ(lib.result.denominator,
                reduction == Reduction::kMean        ? c.num_rows()
                : reduction == Reduction::kMeanValid ? 0
                                                     : 1);
      for (double g : lib.grad) ASSERT_EQ(g, 0);
      for (double kl : lib.row_kl) ASSERT_EQ(kl, 0);
      ASSERT_TRUE(lib.result.diagnostics.has_value());
      EXPECT_FALSE(std::isnan(lib.result.diagnostics->mean_entropy_p));
      EXPECT_FALSE(std::isnan(lib.result.diagnostics->mean_entropy_q));
      EXPECT_FALSE(std::isnan(lib.result.diagnostics->topk_recall.value_or(0)));
    }
  }
}

TEST_P(Invariants, SixteenBitInputsGiveTheFloat64AnswerOnRoundedInputs) {
  // The reference decodes the same bytes, so it computes on the rounded
  // values; the library must match it to float32 rounding, not to 16-bit
  // rounding.
  uint64_t seed = 81;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (InputForm form : kInputFormsByTarget) {
      CaseSpec spec;
      spec.B = 2;
      spec.T = 5;
      spec.S = 11;
      spec.form = form;
      spec.K = 6;
      spec.target_dtype = dtype;
      spec.scores_dtype = dtype;
      spec.causal = true;
      SCOPED_TRACE(Describe(spec));
      const Case c = MakeRandomCase(spec, seed++);
      Tolerance tight;
      tight.loss_rel = 1e-6;
      const klref::RefResult ref = CheckAgainstReference(c, tight);
      // The answer on the unrounded values differs by more than the
      // tolerance, so the comparison above does see the rounding.
      klref::RefProblem unrounded = ToReference(c);
      unrounded.scores = c.indexer_scores.values;
      (IsPerHead(form) ? unrounded.logits : unrounded.weights) =
          c.target().values;
      const double loss = klref::ReferenceLoss(unrounded);
      EXPECT_GT(std::fabs(loss - ref.loss), 1e-6 * ref.loss);
    }
  }
}

}  // namespace
}  // namespace klserve::testdata
