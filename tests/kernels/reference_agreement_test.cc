// The library against the float64 reference on seeded random cases: every
// shape class, input form, input dtype, mask, flavour, reduction, scaling
// factor and gradient dtype.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"

namespace klserve::testdata {
namespace {

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16,
                                 DType::kFloat16};

CaseSpec SpecFor(InputForm form, int64_t B, int64_t T, int64_t S,
                 int64_t H = 3) {
  CaseSpec spec;
  spec.B = B;
  spec.T = T;
  spec.S = S;
  spec.H = H;
  spec.form = form;
  if (IsSparse(form)) spec.K = std::max<int64_t>(1, S / 2 + 1);
  return spec;
}

// The suite runs on every backend: the CUDA instantiation runs the same
// cases as the CPU one, against the same float64 reference.
class ReferenceAgreement : public BackendTest {};
KLSERVE_INSTANTIATE_ON_BACKENDS(ReferenceAgreement);

klref::RefResult Check(const CaseSpec& spec, uint64_t seed, Backend* backend) {
  SCOPED_TRACE(Describe(spec) + " seed=" + std::to_string(seed));
  return CheckAgainstReference(MakeRandomCase(spec, seed), {}, backend);
}

TEST_P(ReferenceAgreement, RandomSweep) {
  std::mt19937_64 rng(20251130);
  for (uint64_t i = 0; i < 400; ++i) {
    Check(RandomSpec(rng), 1000 + i, backend());
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_P(ReferenceAgreement, AwkwardShapes) {
  struct Shape {
    int64_t B, T, S;
  };
  const Shape shapes[] = {{1, 1, 1},   {1, 5, 1},  {1, 1, 7},
                          {2, 3, 9},   {3, 7, 5},  {1, 16, 16},
                          {2, 17, 33}, {1, 4, 97}, {2, 9, 130}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (InputForm form : kInputForms) {
      for (int64_t H : {1, 8}) {
        CaseSpec spec = SpecFor(form, s.B, s.T, s.S, H);
        if (!IsSparse(form)) {
          spec.causal = (seed % 2) == 0;
          Check(spec, seed++, backend());
          continue;
        }
        // One slot, exactly S slots, and more slots than keys.
        for (int64_t K : {int64_t{1}, s.S, s.S + 5}) {
          spec.K = K;
          spec.causal = (seed % 2) == 0;
          Check(spec, seed++, backend());
        }
      }
    }
  }
}

TEST_P(ReferenceAgreement, InputDtypes) {
  uint64_t seed = 100;
  for (InputForm form : kInputForms) {
    for (DType target : kFloatTypes) {
      for (DType scores : kFloatTypes) {
        for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
          CaseSpec spec = SpecFor(form, 2, 5, 13);
          spec.target_dtype = target;
          spec.scores_dtype = scores;
          spec.options.flavor = flavor;
          spec.causal = true;
          Check(spec, seed++, backend());
        }
      }
    }
  }
}

TEST_P(ReferenceAgreement, EveryMaskAloneAndTogether) {
  uint64_t seed = 200;
  for (InputForm form : kInputForms) {
    for (int variant = 0; variant < 10; ++variant) {
      CaseSpec spec = SpecFor(form, 2, 6, 11);
      switch (variant) {
        case 0:  // causal, default offset S - T
          spec.causal = true;
          break;
        case 1:
          spec.causal = true;
          spec.q_offset = 0;
          break;
        case 2:
          spec.causal = true;
          spec.q_offset = -2;  // the first rows see nothing
          break;
        case 3:
          spec.causal = true;
          spec.q_offset = 40;  // everything visible
          break;
        case 4:
          spec.segments = true;
          break;
        case 5:
          spec.attention_mask = true;
          break;
        case 6:
          spec.key_padding = true;
          break;
        case 7:
          spec.row_valid = true;
          break;
        case 8:
          spec.causal = spec.segments = spec.attention_mask = true;
          spec.key_padding = spec.row_valid = true;
          break;
        case 9:
          spec.causal = spec.segments = spec.attention_mask = true;
          spec.key_padding = spec.row_valid = true;
          spec.q_offset = -1;
          spec.T = 11;
          break;
      }
      for (Reduction reduction :
           {Reduction::kMean, Reduction::kMeanValid, Reduction::kSum}) {
        spec.options.reduction = reduction;
        Check(spec, seed++, backend());
      }
    }
  }
}

TEST_P(ReferenceAgreement, FlavoursAndReductions) {
  uint64_t seed = 300;
  for (InputForm form : kInputForms) {
    for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
      for (Reduction reduction :
           {Reduction::kMean, Reduction::kMeanValid, Reduction::kSum}) {
        for (bool row_valid : {false, true}) {
          CaseSpec spec = SpecFor(form, 3, 4, 9);
          spec.options.flavor = flavor;
          spec.options.reduction = reduction;
          spec.row_valid = row_valid;
          spec.causal = true;  // some rows with one key, none empty
          spec.zero_weight_fraction = 0.5;  // some zero-target rows
          Check(spec, seed++, backend());
        }
      }
    }
  }
}

TEST_P(ReferenceAgreement, ScalingFactor) {
  uint64_t seed = 400;
  for (InputForm form : kInputForms) {
    for (double c : {0.0, 0.01, 1.0, 7.5, -0.5}) {
      CaseSpec spec = SpecFor(form, 2, 4, 10);
      spec.options.scaling_factor = c;
      spec.options.reduction = Reduction::kMeanValid;
      SCOPED_TRACE(Describe(spec));
      const Case cs = MakeRandomCase(spec, seed++);
      const LibOutput lib = RunLibrary(cs, backend());
      const klref::RefResult ref = klref::ComputeReference(ToReference(cs));
      ExpectMatchesReference(cs, lib, ref);
      ASSERT_TRUE(lib.status.ok());
      // The unscaled loss is defined (and the same) whatever c is.
      EXPECT_GT(lib.result.unscaled_loss, 0);
      EXPECT_NEAR(lib.result.loss, c * lib.result.unscaled_loss,
                  1e-12 * std::abs(lib.result.loss));
      if (c == 0) {
        EXPECT_EQ(lib.result.loss, 0);
        for (double g : lib.grad) ASSERT_EQ(g, 0);
      }
    }
  }
}

// grad_scale multiplies the gradient only: the loss keeps every bit of the
// run without it.
TEST_P(ReferenceAgreement, GradScale) {
  uint64_t seed = 450;
  for (InputForm form : kInputForms) {
    for (DType grad : kFloatTypes) {
      for (double grad_scale : {0.0, 0.5, 3.0, -2.0, 40.0}) {
        CaseSpec spec = SpecFor(form, 2, 4, 10);
        spec.options.grad_dtype = grad;
        spec.options.scaling_factor = 0.25;
        spec.options.grad_scale = grad_scale;
        SCOPED_TRACE(Describe(spec));
        SCOPED_TRACE(grad_scale);
        const Case cs = MakeRandomCase(spec, seed);
        const LibOutput lib = RunLibrary(cs, backend());
        ExpectMatchesReference(cs, lib,
                               klref::ComputeReference(ToReference(cs)));
        Case unscaled = cs;
        unscaled.options.grad_scale = 1.0;
        const LibOutput plain = RunLibrary(unscaled, backend());
        ASSERT_TRUE(lib.status.ok() && plain.status.ok());
        EXPECT_EQ(lib.result.loss, plain.result.loss);
        EXPECT_EQ(lib.result.unscaled_loss, plain.result.unscaled_loss);
        if (grad_scale == 0) {
          for (double g : lib.grad) ASSERT_EQ(g, 0);
        }
      }
      ++seed;
    }
  }
}

TEST_P(ReferenceAgreement, GradDtypes) {
  uint64_t seed = 500;
  for (InputForm form : kInputForms) {
    for (DType grad : kFloatTypes) {
      for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
        for (double c : {1.0, 0.01}) {
          CaseSpec spec = SpecFor(form, 2, 7, 21);
          spec.options.grad_dtype = grad;
          spec.options.flavor = flavor;
          spec.options.scaling_factor = c;
          spec.options.reduction = Reduction::kMean;
          Check(spec, seed++, backend());
        }
      }
    }
  }
}

TEST_P(ReferenceAgreement, SoftmaxScale) {
  uint64_t seed = 600;
  for (InputForm form : {InputForm::kDensePerHead, InputForm::kSparsePerHead}) {
    for (float scale : {0.01f, 0.125f, 0.7f, 1.0f, 3.5f}) {
      for (DType target : kFloatTypes) {
        CaseSpec spec = SpecFor(form, 1, 5, 12, 4);
        spec.options.softmax_scale = scale;
        spec.target_dtype = target;
        Check(spec, seed++, backend());
      }
    }
  }
}

TEST_P(ReferenceAgreement, OutputsAreOptional) {
  uint64_t seed = 700;
  for (InputForm form : kInputForms) {
    for (int variant = 0; variant < 3; ++variant) {
      CaseSpec spec = SpecFor(form, 2, 5, 8);
      spec.options.want_grad = variant != 0;
      spec.options.want_row_kl = variant != 1;
      spec.options.want_diagnostics = variant != 2;
      Check(spec, seed++, backend());
    }
  }
}

TEST_P(ReferenceAgreement, LongRowsExerciseVectorBodiesAndTails) {
  uint64_t seed = 800;
  for (int64_t S : {15, 16, 17, 31, 33, 63, 64, 65, 257}) {
    for (InputForm form : kInputForms) {
      CaseSpec spec = SpecFor(form, 2, 19, S, 2);
      if (IsSparse(form)) spec.K = S - 1 + (seed % 3);
      spec.causal = true;
      spec.key_padding = true;
      spec.target_dtype = (seed % 3 == 0) ? DType::kBFloat16 : DType::kFloat32;
      spec.scores_dtype = (seed % 3 == 1) ? DType::kFloat16 : DType::kFloat32;
      spec.options.flavor = (seed % 2) ? Flavor::kExact : Flavor::kMaxText;
      Check(spec, seed++, backend());
    }
  }
}

TEST_P(ReferenceAgreement, ManyRowsAcrossThreads) {
  // Enough rows for the pool to split them into several chunks.
  uint64_t seed = 900;
  for (InputForm form : kInputForms) {
    CaseSpec spec = SpecFor(form, 3, 150, 24, 2);
    spec.causal = true;
    spec.row_valid = true;
    spec.options.reduction = Reduction::kMeanValid;
    Check(spec, seed++, backend());
  }
}

// Runs the encoded case with every input view moved to an odd address.
LibOutput RunUnaligned(const Case& c, bool unaligned, Backend& backend) {
  EncodedCase encoded(c);
  std::vector<std::vector<std::byte>> storage;
  storage.reserve(16);
  auto shift = [&](TensorView& view) {
    if (!unaligned) return;
    storage.emplace_back(view.byte_size + 1);
    std::memcpy(storage.back().data() + 1, view.data, view.byte_size);
    view.data = storage.back().data() + 1;
  };
  IndexerKlInputs& in = encoded.inputs();
  shift(in.indexer_scores);
  for (std::optional<TensorView>* view :
       {&in.attention_logits, &in.attention_weights, &in.topk_indices,
        &in.segment_ids_q, &in.segment_ids_kv, &in.attention_mask,
        &in.key_padding_mask, &in.row_valid}) {
    if (view->has_value()) shift(**view);
  }
  LibOutput out;
  absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(encoded.inputs(), encoded.options());
  if (!problem.ok()) {
    out.status = problem.status();
    return out;
  }
  const absl::StatusOr<RowData> rows = WholeRowData(*problem, encoded.inputs());
  if (!rows.ok()) {
    out.status = rows.status();
    return out;
  }
  // The gradient lands one float off the vector alignment too: the CPU
  // backend peels a row's unaligned head off its streaming stores, and the
  // head must round like the body.
  const size_t grad_size =
      c.num_rows() * c.slots() * DTypeSize(c.options.grad_dtype);
  const size_t grad_offset = unaligned ? sizeof(float) : 0;
  std::vector<std::byte> grad(grad_offset + grad_size, std::byte{0});
  out.row_kl.assign(c.num_rows(), 0.0);
  LossOutputs outputs;
  outputs.grad = grad.data() + grad_offset;
  outputs.grad_byte_size = static_cast<int64_t>(grad_size);
  outputs.row_kl = out.row_kl.data();
  outputs.row_kl_size = c.num_rows();
  absl::StatusOr<IndexerKlResult> result =
      ComputeIndexerKl(backend, *problem, *rows, outputs);
  out.grad_bytes.assign(grad.begin() + grad_offset, grad.end());
  if (!result.ok()) {
    out.status = result.status();
  } else {
    out.result = *result;
  }
  return out;
}

TEST_P(ReferenceAgreement, UnalignedBuffersGiveTheSameBits) {
  uint64_t seed = 1000;
  for (InputForm form : kInputForms) {
    for (DType dtype : kFloatTypes) {
      CaseSpec spec = SpecFor(form, 2, 9, 37);
      spec.target_dtype = spec.scores_dtype = dtype;
      spec.causal = spec.segments = spec.attention_mask = true;
      spec.key_padding = spec.row_valid = true;
      SCOPED_TRACE(Describe(spec));
      const Case c = MakeRandomCase(spec, seed++);
      const LibOutput aligned = RunUnaligned(c, false, *backend());
      const LibOutput odd = RunUnaligned(c, true, *backend());
      ASSERT_TRUE(aligned.status.ok()) << aligned.status;
      ASSERT_TRUE(odd.status.ok()) << odd.status;
      EXPECT_EQ(aligned.result.loss, odd.result.loss);
      EXPECT_EQ(aligned.row_kl, odd.row_kl);
      EXPECT_EQ(aligned.grad_bytes, odd.grad_bytes);
    }
  }
}

}  // namespace
}  // namespace klserve::testdata
