// Every error rule: INVALID_ARGUMENT with a message naming the field.
// Structural rules (shapes, dtypes, byte sizes, options) must be caught by
// IndexerKlProblem::Create; value rules (NaN, infinities, indices, rows with
// no distribution) by the computation, with the message starting with the
// tensor's name. For each value rule the reference is asked too, so that the
// test is known to build the case it means.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "tests/kernels/test_backends.h"
#include "tests/kernels/test_data.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klserve::testdata {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// B=2, T=4, S=6, H=2, K=5 with every optional tensor present.
Case FullBase(InputForm form) {
  CaseSpec spec;
  spec.B = 2;
  spec.T = 4;
  spec.S = 6;
  spec.form = form;
  spec.H = 2;
  spec.K = 5;
  spec.causal = true;
  spec.segments = spec.attention_mask = spec.key_padding = true;
  spec.row_valid = true;
  return MakeRandomCase(spec, 7);
}

// The same shapes with a causal mask only and an all-true row_valid.
Case DataBase(InputForm form) {
  CaseSpec spec;
  spec.B = 2;
  spec.T = 4;
  spec.S = 6;
  spec.form = form;
  spec.H = 2;
  spec.K = 5;
  spec.causal = true;
  spec.empty_slot_fraction = 0.3;
  spec.zero_weight_fraction = 0;
  Case c = MakeRandomCase(spec, 8);
  c.row_valid = HostTensor(DType::kBool, {2, 4}, 1);
  return c;
}

void Resize(HostTensor& t, std::vector<int64_t> shape) {
  t.shape = std::move(shape);
  t.values.assign(t.num_elements(), 0.5);
}

// Expects Create to reject `c`, naming one of `fields`.
void ExpectCreateRejects(const Case& c,
                         std::initializer_list<std::string_view> fields) {
  const EncodedCase encoded(c);
  ExpectInvalidNaming(CreateStatus(encoded), fields);
}

// Expects the reference and the library to reject `c` for `field`.
void ExpectValueError(const Case& c, std::string_view field) {
  EXPECT_EQ(klref::ComputeReference(ToReference(c)).error, field)
      << "(the reference disagrees: the test case is wrong)";
  ExpectInvalidStartingWith(RunStatus(c), {field});
}

const char* TargetName(const Case& c) {
  return c.attention_logits ? "attention_logits" : "attention_weights";
}

// Flat [B,T,L] index of the first slot of row r with the given validity.
int64_t FindSlot(const Case& c, bool valid, int64_t first_row = 0) {
  const klref::RefResult ref = klref::ComputeReference(ToReference(c));
  EXPECT_EQ(ref.error, "");
  const int64_t L = c.slots();
  for (int64_t i = first_row * L; i < c.num_rows() * L; ++i) {
    if ((ref.valid[i] != 0) == valid) return i;
  }
  ADD_FAILURE() << "no slot with validity " << valid;
  return 0;
}

// Flat index of an empty (-1) slot.
int64_t FindEmptySlot(const Case& c) {
  for (size_t i = 0; i < c.topk_indices->values.size(); ++i) {
    if (c.topk_indices->values[i] == -1) return static_cast<int64_t>(i);
  }
  ADD_FAILURE() << "no empty slot";
  return 0;
}

// Sets the target value of slot i ([B,T,L] index) in every head.
void SetTarget(Case& c, int64_t i, double value, int64_t only_head = -1) {
  const int64_t L = c.slots(), r = i / L, j = i % L;
  if (c.attention_logits) {
    for (int64_t h = 0; h < c.H; ++h) {
      if (only_head >= 0 && h != only_head) continue;
      c.attention_logits->at({r / c.T, h, r % c.T, j}) = value;
    }
  } else {
    c.attention_weights->values[i] = value;
  }
}

// ---------------------------------------------------------------------------
// Structural rules, caught by Create.

// The suite runs on every backend (test_backends.h); its helpers compute
// with the backend under test.
class Validate : public BackendTest {};
KLSERVE_INSTANTIATE_ON_BACKENDS(Validate);

TEST_P(Validate, AcceptsTheBaseCases) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    const Case full = FullBase(form);
    const EncodedCase encoded(full);
    EXPECT_TRUE(CreateStatus(encoded).ok()) << CreateStatus(encoded);
    EXPECT_TRUE(RunStatus(full).ok()) << RunStatus(full);
    EXPECT_TRUE(RunStatus(DataBase(form)).ok());
  }
}

TEST_P(Validate, RejectsScoresShapeMismatch) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    const Case base = FullBase(form);
    const int64_t L = base.slots();
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{2, 4, L + 1}, {2, 5, L}, {3, 4, L}}) {
      Case c = base;
      Resize(c.indexer_scores, shape);
      ExpectCreateRejects(c, {"indexer_scores", TargetName(c), "topk_indices",
                              "attention_mask", "row_valid", "segment_ids_q",
                              "segment_ids_kv", "key_padding_mask"});
    }
  }
}

TEST_P(Validate, RejectsTargetShapeMismatch) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    Case c = FullBase(form);
    const int64_t L = c.slots();
    if (IsPerHead(form)) {
      Resize(*c.attention_logits, {2, 2, 4, L - 1});
    } else {
      Resize(*c.attention_weights, {2, 3, L});
    }
    ExpectCreateRejects(c, {TargetName(c), "indexer_scores"});
  }
}

// The expected shape of a target is built from indexer_scores (and H from
// the logits' own second dimension): the message says so, since a wrong
// scores tensor, or logits sent as [B, T, H, S], makes a right target look
// wrong.
TEST_P(Validate, ATargetShapeMismatchSaysWhereTheExpectedShapeCameFrom) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    Case c = FullBase(form);
    const int64_t L = c.slots();
    Resize(c.indexer_scores, {2, 4, L - 1});
    if (IsSparse(form)) Resize(*c.topk_indices, {2, 4, L - 1});
    const absl::Status status = CreateStatus(EncodedCase(c));
    ASSERT_FALSE(status.ok());
    EXPECT_TRUE(absl::StrContains(
        status.message(),
        IsPerHead(form) ? "(H from its own second dimension, the rest from "
                          "indexer_scores' shape)"
                        : "(from indexer_scores' shape)"))
        << status;
  }
}

TEST_P(Validate, RejectsWrongRank) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    const Case base = FullBase(form);
    const int64_t L = base.slots();
    Case c = base;
    Resize(c.indexer_scores, {8, L});
    ExpectCreateRejects(c, {"indexer_scores"});
    c = base;
    if (IsPerHead(form)) {
      Resize(*c.attention_logits, {2, 4, L});  // a [B,T,S] tensor as logits
    } else {
      Resize(*c.attention_weights, {2, 1, 4, L});
    }
    ExpectCreateRejects(c, {TargetName(c)});
    if (IsSparse(form)) {
      c = base;
      Resize(*c.topk_indices, {2, 4, L, 1});
      ExpectCreateRejects(c, {"topk_indices"});
    }
  }
}

TEST_P(Validate, RejectsTopkShapeMismatch) {
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    const Case base = FullBase(form);
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{2, 4, 6}, {2, 3, 5}, {1, 4, 5}}) {
      Case c = base;
      Resize(*c.topk_indices, shape);
      for (double& v : c.topk_indices->values) v = -1;
      ExpectCreateRejects(c, {"topk_indices", "indexer_scores"});
    }
  }
}

TEST_P(Validate, RejectsMaskShapeMismatch) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    const Case base = FullBase(form);
    Case c = base;
    Resize(*c.segment_ids_q, {2, 5});
    ExpectCreateRejects(c, {"segment_ids_q"});
    c = base;
    Resize(*c.segment_ids_kv, {2, 7});  // S + 1
    ExpectCreateRejects(c, {"segment_ids_kv"});
    c = base;
    Resize(*c.attention_mask, {2, 4, 7});
    ExpectCreateRejects(c, {"attention_mask"});
    c = base;
    Resize(*c.attention_mask, {2, 4});
    ExpectCreateRejects(c, {"attention_mask"});
    c = base;
    Resize(*c.key_padding_mask, {3, 6});
    ExpectCreateRejects(c, {"key_padding_mask"});
    c = base;
    Resize(*c.row_valid, {2, 3});
    ExpectCreateRejects(c, {"row_valid"});
  }
}

TEST_P(Validate, RejectsSparseAttentionMaskShapedLikeTheSlots) {
  // The explicit mask is indexed by key ([B,T,S]) in both stages.
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    Case c = FullBase(form);
    Resize(*c.attention_mask, {2, 4, 5});  // [B,T,K]
    ExpectCreateRejects(c, {"attention_mask"});
  }
}

TEST_P(Validate, RejectsByteSizeMismatch) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    const Case base = FullBase(form);
    struct Field {
      const char* name;
      std::optional<TensorView> IndexerKlInputs::*member;
    };
    const Field optional_fields[] = {
        {"attention_logits", &IndexerKlInputs::attention_logits},
        {"attention_weights", &IndexerKlInputs::attention_weights},
        {"topk_indices", &IndexerKlInputs::topk_indices},
        {"segment_ids_q", &IndexerKlInputs::segment_ids_q},
        {"segment_ids_kv", &IndexerKlInputs::segment_ids_kv},
        {"attention_mask", &IndexerKlInputs::attention_mask},
        {"key_padding_mask", &IndexerKlInputs::key_padding_mask},
        {"row_valid", &IndexerKlInputs::row_valid},
    };
    for (const Field& field : optional_fields) {
      EncodedCase encoded(base);
      std::optional<TensorView>& view = encoded.inputs().*(field.member);
      if (!view.has_value()) continue;
      SCOPED_TRACE(field.name);
      view->byte_size -= 1;
      ExpectInvalidNaming(CreateStatus(encoded), {field.name});
      view->byte_size = 0;
      ExpectInvalidNaming(CreateStatus(encoded), {field.name});
    }
    EncodedCase encoded(base);
    encoded.inputs().indexer_scores.byte_size -= 1;
    ExpectInvalidNaming(CreateStatus(encoded), {"indexer_scores"});
  }
}

TEST_P(Validate, RejectsDisallowedDtypes) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    const Case base = FullBase(form);
    auto expect_rejected = [&](auto member, DType dtype, const char* name) {
      Case c = base;
      HostTensor& t = member(c);
      t.dtype = dtype;
      SCOPED_TRACE(std::string(name) + " as " + std::string(DTypeName(dtype)));
      ExpectCreateRejects(c, {name});
    };
    auto scores = [](Case& c) -> HostTensor& { return c.indexer_scores; };
    auto target = [](Case& c) -> HostTensor& { return c.target(); };
    auto seg_q = [](Case& c) -> HostTensor& { return *c.segment_ids_q; };
    auto seg_kv = [](Case& c) -> HostTensor& { return *c.segment_ids_kv; };
    auto mask = [](Case& c) -> HostTensor& { return *c.attention_mask; };
    auto padding = [](Case& c) -> HostTensor& { return *c.key_padding_mask; };
    auto row_valid = [](Case& c) -> HostTensor& { return *c.row_valid; };
    expect_rejected(scores, DType::kInt32, "indexer_scores");
    expect_rejected(scores, DType::kBool, "indexer_scores");
    expect_rejected(target, DType::kInt32, TargetName(base));
    expect_rejected(target, DType::kBool, TargetName(base));
    expect_rejected(seg_q, DType::kFloat32, "segment_ids_q");
    expect_rejected(seg_kv, DType::kBool, "segment_ids_kv");
    expect_rejected(mask, DType::kInt32, "attention_mask");
    expect_rejected(mask, DType::kFloat32, "attention_mask");
    expect_rejected(padding, DType::kFloat16, "key_padding_mask");
    expect_rejected(row_valid, DType::kInt32, "row_valid");
    if (IsSparse(form)) {
      auto topk = [](Case& c) -> HostTensor& { return *c.topk_indices; };
      expect_rejected(topk, DType::kFloat32, "topk_indices");
      expect_rejected(topk, DType::kBool, "topk_indices");
    }
  }
}

TEST_P(Validate, RejectsDimensionProductOverflow) {
  // Views with huge dimensions over a few bytes: the element count or the
  // byte count overflows int64 (one of them wraps to exactly 0).
  const std::vector<std::vector<int64_t>> shapes = {
      {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31},
      {int64_t{1} << 32, int64_t{1} << 32, 4},  // 2^66 elements: wraps to 0
      {int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 21},  // 2^63 bytes
      {std::numeric_limits<int64_t>::max(), 2, 1},
  };
  const std::vector<std::byte> bytes(64);
  for (const std::vector<int64_t>& shape : shapes) {
    for (int64_t byte_size : {int64_t{0}, int64_t{64}}) {
      IndexerKlInputs inputs;
      TensorView view;
      view.dtype = DType::kFloat32;
      view.shape.assign(shape.begin(), shape.end());
      view.data = bytes.data();
      view.byte_size = byte_size;
      inputs.indexer_scores = view;
      inputs.attention_weights = view;
      ExpectInvalidNaming(
          IndexerKlProblem::Create(inputs, IndexerKlOptions()).status(),
          {"indexer_scores", "attention_weights"});
      // Per-head logits: B*H*T*S overflows while [B,T,S] does not.
      IndexerKlInputs per_head;
      per_head.indexer_scores = view;
      per_head.indexer_scores.shape = {1, 1, 16};
      per_head.indexer_scores.byte_size = 64;
      per_head.attention_logits = view;
      per_head.attention_logits->shape = {1, shape[0], 1, 16};
      ExpectInvalidNaming(
          IndexerKlProblem::Create(per_head, IndexerKlOptions()).status(),
          {"attention_logits"});
    }
  }
}

TEST_P(Validate, RejectsZeroSizedDimensions) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    for (int dim = 0; dim < 5; ++dim) {  // B, T, S, H, K
      if (dim == 3 && !IsPerHead(form)) continue;
      if (dim == 4 && !IsSparse(form)) continue;
      int64_t B = 2, T = 3, S = 4, H = 2, K = 3;
      (dim == 0 ? B : dim == 1 ? T : dim == 2 ? S : dim == 3 ? H : K) = 0;
      SCOPED_TRACE("zero dimension " + std::string(1, "BTSHK"[dim]));
      Case c;
      c.B = B;
      c.T = T;
      c.S = S;
      c.K = IsSparse(form) ? K : 0;
      const int64_t L = IsSparse(form) ? K : S;
      c.indexer_scores = HostTensor(DType::kFloat32, {B, T, L});
      if (IsPerHead(form)) {
        c.H = H;
        c.attention_logits = HostTensor(DType::kFloat32, {B, H, T, L});
      } else {
        c.attention_weights = HostTensor(DType::kFloat32, {B, T, L}, 1);
      }
      if (IsSparse(form)) {
        c.topk_indices = HostTensor(DType::kInt32, {B, T, K}, -1);
        c.options.num_keys = S;
      }
      ExpectCreateRejects(c, {"indexer_scores", "attention_logits",
                              "attention_weights", "topk_indices", "num_keys"});
    }
  }
}

TEST_P(Validate, RejectsBothTargetsOrNone) {
  for (bool sparse : {false, true}) {
    Case both = FullBase(MakeInputForm(sparse, true));
    both.attention_weights =
        HostTensor(DType::kFloat32, {2, 4, both.slots()}, 1.0);
    ExpectCreateRejects(both, {"attention_logits", "attention_weights"});
    Case none = FullBase(MakeInputForm(sparse, false));
    none.attention_weights.reset();
    ExpectCreateRejects(none, {"attention_logits", "attention_weights"});
  }
}

TEST_P(Validate, RejectsSegmentIdsGivenAlone) {
  for (InputForm form : kInputForms) {
    Case c = FullBase(form);
    c.segment_ids_kv.reset();
    ExpectCreateRejects(c, {"segment_ids_q", "segment_ids_kv"});
    c = FullBase(form);
    c.segment_ids_q.reset();
    ExpectCreateRejects(c, {"segment_ids_q", "segment_ids_kv"});
  }
}

TEST_P(Validate, RejectsBadNumKeys) {
  for (bool per_head : {true, false}) {
    Case sparse = FullBase(MakeInputForm(true, per_head));
    sparse.options.num_keys = 0;
    ExpectCreateRejects(sparse, {"num_keys"});
    sparse.options.num_keys = -6;
    ExpectCreateRejects(sparse, {"num_keys"});
    Case dense = FullBase(MakeInputForm(false, per_head));
    dense.options.num_keys = dense.S + 1;
    ExpectCreateRejects(dense, {"num_keys"});
    dense.options.num_keys = dense.S;  // allowed
    const EncodedCase encoded(dense);
    EXPECT_TRUE(CreateStatus(encoded).ok()) << CreateStatus(encoded);
  }
}

TEST_P(Validate, RejectsBadSoftmaxScale) {
  for (bool sparse : {false, true}) {
    for (float scale :
         {std::numeric_limits<float>::quiet_NaN(),
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, -0.5f}) {
      Case c = FullBase(MakeInputForm(sparse, true));
      c.options.softmax_scale = scale;
      SCOPED_TRACE(scale);
      ExpectCreateRejects(c, {"softmax_scale"});
    }
  }
}

// Weights are probabilities: a scale of the logits sent with them was meant
// for logits, and is refused rather than ignored; 1 is the same as none.
TEST_P(Validate, RejectsASoftmaxScaleWithWeights) {
  for (bool sparse : {false, true}) {
    Case c = FullBase(MakeInputForm(sparse, /*per_head=*/false));
    c.options.softmax_scale = 0.125f;
    ExpectCreateRejects(c, {"softmax_scale"});
    EXPECT_TRUE(absl::StrContains(CreateStatus(EncodedCase(c)).message(),
                                  "scales attention_logits, not "
                                  "attention_weights"))
        << CreateStatus(EncodedCase(c));
    c.options.softmax_scale = 1.0f;
    EXPECT_TRUE(CreateStatus(EncodedCase(c)).ok())
        << CreateStatus(EncodedCase(c));
  }
}

// c may be any finite value up to the largest float32 (the loss, a double,
// stays finite); the gradient's bound is on c / N * grad_scale (below).
TEST_P(Validate, RejectsBadScalingFactor) {
  for (double factor : {kNaN, kInf, -kInf, 1e308, -1e308, 3.5e38}) {
    for (InputForm form : kInputForms) {
      Case c = FullBase(form);
      c.options.scaling_factor = factor;
      SCOPED_TRACE(factor);
      ExpectCreateRejects(c, {"scaling_factor"});
    }
  }
  // The value as sent, all its digits.
  Case c = FullBase(InputForm::kDenseAggregated);
  c.options.scaling_factor = 3.4028234663852891e38;
  const absl::Status status = CreateStatus(EncodedCase(c));
  EXPECT_TRUE(absl::StrContains(status.message(), "got 3.402823466385289e+38"))
      << status;
  // Past FP16's range c is fine where the gradient is FP32 or not asked for.
  for (const bool want_grad : {true, false}) {
    Case large = FullBase(InputForm::kDensePerHead);
    large.options.want_grad = want_grad;
    large.options.scaling_factor = want_grad ? 1e30 : -3.4e38;
    const EncodedCase encoded(large);
    EXPECT_TRUE(CreateStatus(encoded).ok()) << CreateStatus(encoded);
  }
}

// Every gradient entry is c / N * grad_scale times a value of magnitude at
// most 1: past the grad dtype's largest finite value, that factor could
// overflow it.
TEST_P(Validate, GradScaleMustKeepTheGradientFinite) {
  for (double grad_scale : {kNaN, kInf, -kInf}) {
    Case c = FullBase(InputForm::kDenseAggregated);
    c.options.grad_scale = grad_scale;
    SCOPED_TRACE(grad_scale);
    ExpectCreateRejects(c, {"grad_scale"});
  }
  // N = 1 under SUM, B * T = 8 under MEAN.
  const struct {
    DType grad_dtype;
    Reduction reduction;
    double scaling_factor, grad_scale;
    bool accepted;
  } cases[] = {
      {DType::kFloat16, Reduction::kSum, 1.0, 65504.0, true},
      {DType::kFloat16, Reduction::kSum, 1.0, 65505.0, false},
      {DType::kFloat16, Reduction::kSum, 0.01, 6.5e6, true},
      {DType::kFloat16, Reduction::kSum, -0.01, 6.6e6, false},
      {DType::kFloat16, Reduction::kMean, 1.0, 8 * 65504.0, true},
      {DType::kFloat16, Reduction::kMean, 1.0, 8 * 65505.0, false},
      {DType::kFloat16, Reduction::kMean, 65536.0, 2.0, true},
      // 1 / 8 * (8 * 65504 + 0.01) is 65504.00125 in double and 65504 as
      // the float32 the rows take, the value bounded.
      {DType::kFloat16, Reduction::kMean, 1.0, 8 * 65504.0 + 0.01, true},
      {DType::kFloat16, Reduction::kMean, 1.0, 8 * 65504.0 + 128, false},
      {DType::kBFloat16, Reduction::kSum, 1.0, 1e38, true},
      {DType::kBFloat16, Reduction::kSum, 2.0, 1.7e38, false},
      {DType::kBFloat16, Reduction::kMean, 2.0, 1.7e38, true},
      {DType::kFloat32, Reduction::kSum, 1.0, 3.4e38, true},
      {DType::kFloat32, Reduction::kSum, 1.0, 1e300, false},
      {DType::kFloat32, Reduction::kMean, 1e30, 1e10, false},
  };
  for (const auto& k : cases) {
    Case c = FullBase(InputForm::kSparsePerHead);
    c.options.grad_dtype = k.grad_dtype;
    c.options.reduction = k.reduction;
    c.options.scaling_factor = k.scaling_factor;
    c.options.grad_scale = k.grad_scale;
    SCOPED_TRACE(absl::StrCat(DTypeName(k.grad_dtype), " c=", k.scaling_factor,
                              " grad_scale=", k.grad_scale));
    if (k.accepted) {
      const EncodedCase encoded(c);
      EXPECT_TRUE(CreateStatus(encoded).ok()) << CreateStatus(encoded);
    } else {
      ExpectCreateRejects(c, {"grad_scale"});
    }
  }
  // The message quotes the factor the bound is on, N included.
  Case over = FullBase(InputForm::kDenseAggregated);
  over.options.grad_dtype = DType::kFloat16;
  over.options.reduction = Reduction::kMean;
  over.options.scaling_factor = 3000;
  over.options.grad_scale = 300;
  const EncodedCase encoded_over(over);
  const absl::Status refused = CreateStatus(encoded_over);
  EXPECT_TRUE(absl::StrContains(
      refused.message(), "grad_scale: |scaling_factor / N * grad_scale|"))
      << refused;
  EXPECT_TRUE(
      absl::StrContains(refused.message(), "got 3000 / 8 * 300 = 112500"))
      << refused;
  // Just past the bound in float32, the factor prints with all its digits.
  over.options.reduction = Reduction::kSum;
  over.options.scaling_factor = 1;
  over.options.grad_scale = 65520.000000000007;
  const EncodedCase just_over(over);
  EXPECT_TRUE(absl::StrContains(CreateStatus(just_over).message(),
                                "= 65520.000000000007"))
      << CreateStatus(just_over);
  // Without a gradient the bound has nothing to protect.
  Case no_grad = FullBase(InputForm::kDenseAggregated);
  no_grad.options.want_grad = false;
  no_grad.options.grad_scale = 1e300;
  const EncodedCase encoded(no_grad);
  EXPECT_TRUE(CreateStatus(encoded).ok()) << CreateStatus(encoded);
}

TEST_P(Validate, RejectsNegativeRecallK) {
  Case c = FullBase(InputForm::kDenseAggregated);
  c.options.recall_k = -1;
  ExpectCreateRejects(c, {"recall_k"});
}

TEST_P(Validate, RejectsGradDtypeThatIsNotAFloat) {
  for (DType dtype : {DType::kInt32, DType::kBool}) {
    Case c = FullBase(InputForm::kSparsePerHead);
    c.options.grad_dtype = dtype;
    ExpectCreateRejects(c, {"grad_dtype"});
  }
}

// ---------------------------------------------------------------------------
// Output buffers, checked by ComputeIndexerKl.

TEST_P(Validate, RejectsOutputBuffersTooSmall) {
  for (DType grad_dtype : {DType::kFloat32, DType::kBFloat16}) {
    Case c = DataBase(InputForm::kDensePerHead);
    c.options.grad_dtype = grad_dtype;
    c.options.want_row_kl = true;
    const EncodedCase encoded(c);
    const absl::StatusOr<IndexerKlProblem> problem =
        IndexerKlProblem::Create(encoded.inputs(), encoded.options());
    ASSERT_TRUE(problem.ok()) << problem.status();
    const absl::StatusOr<RowData> row_data =
        WholeRowData(*problem, encoded.inputs());
    ASSERT_TRUE(row_data.ok()) << row_data.status();
    const int64_t grad_bytes = c.num_rows() * c.S * DTypeSize(grad_dtype);
    std::vector<std::byte> grad(grad_bytes);
    std::vector<double> row_kl(c.num_rows());
    auto run = [&](void* g, int64_t g_size, double* kl, int64_t kl_size) {
      LossOutputs outputs;
      outputs.grad = g;
      outputs.grad_byte_size = g_size;
      outputs.row_kl = kl;
      outputs.row_kl_size = kl_size;
      return ComputeIndexerKl(*backend(), *problem, *row_data, outputs)
          .status();
    };
    const int64_t rows = c.num_rows();
    EXPECT_TRUE(run(grad.data(), grad_bytes, row_kl.data(), rows).ok());
    ExpectInvalidNaming(run(grad.data(), grad_bytes - 1, row_kl.data(), rows),
                        {"grad", "grad_byte_size"});
    ExpectInvalidNaming(run(nullptr, 0, row_kl.data(), rows),
                        {"grad", "grad_byte_size"});
    ExpectInvalidNaming(run(grad.data(), grad_bytes, row_kl.data(), rows - 1),
                        {"row_kl", "row_kl_size"});
    ExpectInvalidNaming(run(grad.data(), grad_bytes, nullptr, 0),
                        {"row_kl", "row_kl_size"});
  }
}

// ---------------------------------------------------------------------------
// Value rules, caught while computing.

// The contract's slot rule: an index outside [0, S), -1 or any other, names
// no key and leaves its slot empty, in a masked row too; several may share a
// row without being a repeated key.
TEST_P(Validate, TopkIndexOutsideTheKeysIsAnEmptySlot) {
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    for (double index :
         {6.0, 7.0, 1000.0, -2.0, -7.0, 2147483647.0, -2147483648.0}) {
      SCOPED_TRACE(index);
      Case c = DataBase(form);
      c.topk_indices->at({1, 2, 3}) = index;
      c.topk_indices->at({1, 2, 4}) = index;
      c.topk_indices->at({0, 3, 0}) = index;
      ExpectMatchesReference(c, RunLibrary(c),
                             klref::ComputeReference(ToReference(c)));
      c.row_valid->at({1, 2}) = 0;  // whatever row_valid says
      ExpectMatchesReference(c, RunLibrary(c),
                             klref::ComputeReference(ToReference(c)));
    }
  }
}

TEST_P(Validate, RejectsDuplicateTopkIndex) {
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    Case c = DataBase(form);
    // Row (1, 3) sees every key; name key 1 in two slots.
    for (int64_t j = 0; j < 5; ++j) c.topk_indices->at({1, 3, j}) = j;
    c.topk_indices->at({1, 3, 4}) = 1;
    ExpectValueError(c, "topk_indices");
  }
}

TEST_P(Validate, RejectsDuplicateTopkIndexOfAMaskedKey) {
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    Case c = DataBase(form);
    // Row (0, 0) sees keys 0..2 (causal, offset 2); name key 5 twice.
    for (int64_t j = 0; j < 5; ++j) c.topk_indices->at({0, 0, j}) = j;
    c.topk_indices->at({0, 0, 3}) = 5;
    c.topk_indices->at({0, 0, 4}) = 5;
    ExpectValueError(c, "topk_indices");
  }
}

// The index rules at the largest num_keys: they need memory of the row's
// slots, not of S (a table of S entries took 16 GiB per thread here).
constexpr int64_t kMaxKeys = std::numeric_limits<int32_t>::max();

// A [1, 1, 4] row over S = 8 that the reference can check.
Case FourSlots(InputForm form) {
  CaseSpec spec;
  spec.T = 1;
  spec.S = 8;
  spec.form = form;
  spec.K = 4;
  spec.zero_weight_fraction = 0;
  spec.empty_slot_fraction = 0;
  spec.garbage_at_invalid = false;
  Case c = MakeRandomCase(spec, 9);
  c.topk_indices->values = {5, 0, 7, -1};
  return c;
}

// `c` over kMaxKeys keys, its row naming `keys`.
Case OverMaxKeys(const Case& c, std::vector<double> keys) {
  Case huge = c;
  huge.S = kMaxKeys;
  huge.options.num_keys = kMaxKeys;
  huge.topk_indices->values = std::move(keys);
  return huge;
}

TEST_P(Validate, TopkRowsOverTheLargestNumKeys) {
  for (InputForm form :
       {InputForm::kSparsePerHead, InputForm::kSparseAggregated}) {
    SCOPED_TRACE(InputFormName(form));
    const Case small = FourSlots(form);
    // Without causal or masks only the keys' validity matters, so this is
    // the small row's problem with its keys renamed.
    const Case huge = OverMaxKeys(small, {kMaxKeys - 1, 0, 123456789, -1});
    ExpectMatchesReference(huge, RunLibrary(huge),
                           klref::ComputeReference(ToReference(small)));

    EXPECT_EQ(
        RunStatus(OverMaxKeys(small, {kMaxKeys - 1, 0, kMaxKeys - 1, -1})),
        absl::InvalidArgumentError(
            "topk_indices: a key may appear once per row, got key "
            "2147483646 again at [0, 0, 2]"));
    // Indices outside [0, S) name no key, repeated or not; a key named
    // twice after them is still found.
    EXPECT_EQ(RunStatus(OverMaxKeys(small, {kMaxKeys, -2, kMaxKeys, 7})),
              absl::OkStatus());
    EXPECT_EQ(RunStatus(OverMaxKeys(small, {-2, 7, kMaxKeys, 7})),
              absl::InvalidArgumentError(
                  "topk_indices: a key may appear once per row, got key 7 "
                  "again at [0, 0, 3]"));
  }
}

TEST_P(Validate, TopkDuplicatesOfWideRowsOverTheLargestNumKeys) {
  // Three rows of the same 3000 distinct keys, spread over [0, 2^31 - 1):
  // a key may appear once in each row.
  CaseSpec spec;
  spec.T = 3;
  spec.S = 3000;
  spec.form = InputForm::kSparseAggregated;
  spec.K = 3000;
  spec.empty_slot_fraction = 0;
  spec.garbage_at_invalid = false;
  std::vector<double> keys;
  std::mt19937_64 rng(10);
  std::uniform_int_distribution<int32_t> key(0, kMaxKeys - 1);
  std::vector<int32_t> row;
  while (row.size() < 3000) {
    const int32_t k = key(rng);
    if (std::find(row.begin(), row.end(), k) == row.end()) row.push_back(k);
  }
  for (int t = 0; t < 3; ++t) keys.insert(keys.end(), row.begin(), row.end());
  Case c = OverMaxKeys(MakeRandomCase(spec, 11), keys);
  EXPECT_TRUE(RunStatus(c).ok()) << RunStatus(c);

  // Row 2 names its slot 1000's key again in its last slot.
  c.topk_indices->values[2 * 3000 + 2999] = row[1000];
  EXPECT_EQ(RunStatus(c),
            absl::InvalidArgumentError(absl::StrCat(
                "topk_indices: a key may appear once per row, got key ",
                row[1000], " again at [0, 2, 2999]")));
}

TEST_P(Validate, RejectsNanAnywhere) {
  for (InputForm form : kInputForms) {
    const Case base = DataBase(form);
    // Where: a valid slot, a masked slot, an empty slot, a row that
    // row_valid drops.
    std::vector<std::pair<std::string, int64_t>> places = {
        {"valid slot", FindSlot(base, true)},
        {"masked slot", FindSlot(base, false)}};
    if (IsSparse(form)) places.push_back({"empty slot", FindEmptySlot(base)});
    for (const auto& [where, i] : places) {
      for (bool drop_row : {false, true}) {
        SCOPED_TRACE(std::string(InputFormName(form)) + ", " + where +
                     (drop_row ? ", row_valid false" : ""));
        Case c = base;
        if (drop_row) c.row_valid->values[i / c.slots()] = 0;
        Case bad = c;
        bad.indexer_scores.values[i] = kNaN;
        ExpectValueError(bad, "indexer_scores");
        bad = c;
        SetTarget(bad, i, kNaN, /*only_head=*/1);
        ExpectValueError(bad, TargetName(c));
      }
    }
  }
}

TEST_P(Validate, RejectsPositiveInfinityInLogitsAndScores) {
  for (InputForm form : kInputForms) {
    const Case base = DataBase(form);
    for (bool valid : {true, false}) {
      SCOPED_TRACE(std::string(InputFormName(form)) +
                   (valid ? ", valid slot" : ", masked slot"));
      const int64_t i = FindSlot(base, valid);
      Case bad = base;
      bad.indexer_scores.values[i] = kInf;
      ExpectValueError(bad, "indexer_scores");
      if (IsPerHead(form)) {
        bad = base;
        SetTarget(bad, i, kInf, /*only_head=*/0);
        ExpectValueError(bad, "attention_logits");
      }
    }
  }
}

// The heads after the first are checked inside the previous head's
// exponentials by their max alone, which leaves a NaN or +inf to their own
// exponentials' sum, and with a mask by a running sum of each lane's logits
// too (ScanNextHead). Rows of 70 slots (four whole vectors and a part), a
// bad logit in each later head, in a whole vector and in the part, at
// valid and masked slots; NaNs of both signs and with a payload, and +inf,
// with a -inf in the same lane of the next vector and a NaN in the next
// head: the error names the first bad head, its slot and its value.
TEST_P(Validate, RejectsNanAndPositiveInfinityInEveryLaterHead) {
  const float payload_nan = std::bit_cast<float>(0x7fc12345u);
  for (InputForm form : {InputForm::kDensePerHead, InputForm::kSparsePerHead}) {
    for (bool masked : {false, true}) {
      CaseSpec spec;
      spec.B = 1;
      spec.T = 2;
      spec.S = IsSparse(form) ? 80 : 70;
      spec.form = form;
      spec.H = 4;
      if (IsSparse(form)) spec.K = 70;
      spec.attention_mask = masked;
      spec.empty_slot_fraction = 0;
      spec.garbage_at_invalid = false;
      const Case base = MakeRandomCase(spec, 21);
      const int64_t L = base.slots();
      ASSERT_EQ(L, 70);
      // Row 1's first slot of each validity in the whole vectors and in
      // the part.
      const klref::RefResult ref = klref::ComputeReference(ToReference(base));
      ASSERT_EQ(ref.error, "");
      std::vector<int64_t> slots;
      for (bool valid : {true, false}) {
        for (auto [begin, end] :
             {std::pair<int64_t, int64_t>{0, 64}, {64, L}}) {
          for (int64_t j = begin; j < end; ++j) {
            if ((ref.valid[L + j] != 0) == valid) {
              slots.push_back(j);
              break;
            }
          }
        }
      }
      ASSERT_EQ(slots.size(), masked ? 4u : 2u);
      for (int64_t h = 1; h < base.H; ++h) {
        for (int64_t j : slots) {
          for (double value : {kNaN, -kNaN, double{payload_nan}, kInf}) {
            SCOPED_TRACE(absl::StrCat(InputFormName(form),
                                      masked ? " masked" : "", " head ", h,
                                      " slot ", j, " value ", value));
            Case bad = base;
            bad.attention_logits->at({0, h, 1, j}) = value;
            if (j + 16 < L) {
              bad.attention_logits->at({0, h, 1, j + 16}) = -kInf;
            }
            if (h + 1 < base.H)
              bad.attention_logits->at({0, h + 1, 1, 0}) = kNaN;
            ExpectValueError(bad, "attention_logits");
            EXPECT_EQ(RunStatus(bad).message(),
                      absl::StrCat("attention_logits: logits must not be NaN "
                                   "or +inf, got ",
                                   std::isnan(value) ? "NaN" : "+inf",
                                   " at [0, ", h, ", 1, ", j, "]"));
          }
        }
      }
    }
  }
}

TEST_P(Validate, RejectsNegativeOrInfiniteWeights) {
  for (bool sparse : {false, true}) {
    const Case base = DataBase(MakeInputForm(sparse, false));
    for (bool valid : {true, false}) {
      for (double w : {-1.0, -1e-30, -kInf, kInf}) {
        SCOPED_TRACE(std::string(sparse ? "sparse" : "dense") +
                     (valid ? ", valid slot, " : ", masked slot, ") +
                     std::to_string(w));
        Case bad = base;
        SetTarget(bad, FindSlot(base, valid), w);
        ExpectValueError(bad, "attention_weights");
      }
    }
  }
}

// Every class of float as a head-aggregated weight, in rows of 40 slots
// (two whole vectors of 16 and a part), at a valid slot, an invalid one
// inside the row's first vector and one in a whole vector past the causal
// cut: zeros of both signs, subnormals, the smallest normal and large
// finite weights are legal; negative ones (subnormals included), infinities
// and NaNs of either sign are errors wherever they sit.
TEST_P(Validate, WeightsOfEveryFloatClassAnywhereInTheRow) {
  constexpr float kMin = std::numeric_limits<float>::min();
  constexpr float kMax = std::numeric_limits<float>::max();
  for (bool sparse : {false, true}) {
    CaseSpec spec;
    spec.T = spec.S = spec.K = 40;
    spec.form = MakeInputForm(sparse, false);
    spec.causal = true;
    spec.zero_weight_fraction = 0;
    spec.empty_slot_fraction = 0.3;
    spec.garbage_at_invalid = false;
    const Case base = MakeRandomCase(spec, 40);
    const klref::RefResult ref = klref::ComputeReference(ToReference(base));
    ASSERT_EQ(ref.error, "");
    const int64_t L = base.slots();
    // Row 30's first valid slot; row 2's first invalid slot; in the dense
    // stage, slot 20 of row 3 (its causal cut is at 4, so [16, 32) lies
    // wholly past it).
    std::vector<std::pair<std::string, int64_t>> places;
    for (int64_t j = 0; j < L; ++j) {
      if (ref.valid[30 * L + j]) {
        places.push_back({"valid slot", 30 * L + j});
        break;
      }
    }
    for (int64_t j = 0; j < 16; ++j) {
      if (!ref.valid[2 * L + j]) {
        places.push_back({"invalid slot", 2 * L + j});
        break;
      }
    }
    if (!sparse) places.push_back({"past the causal cut", 3 * L + 20});
    ASSERT_EQ(places.size(), sparse ? 2u : 3u);
    for (const auto& [where, i] : places) {
      for (float w : {0.0f, -0.0f, 1e-40f, kMin, 1e38f, kMax / 64}) {
        SCOPED_TRACE(::testing::Message() << (sparse ? "sparse, " : "dense, ")
                                          << where << ", legal " << w);
        Case c = base;
        c.attention_weights->values[i] = w;
        CheckAgainstReference(c);
      }
      for (float w : {-1e-40f, -kMin, -0.5f, -kMax,
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN(),
                      -std::numeric_limits<float>::quiet_NaN()}) {
        SCOPED_TRACE(::testing::Message() << (sparse ? "sparse, " : "dense, ")
                                          << where << ", illegal " << w);
        Case c = base;
        c.attention_weights->values[i] = w;
        ExpectValueError(c, "attention_weights");
      }
    }
  }
}

// Sets every valid slot of row r to `value` in the scores (or in head h's
// logits when h >= 0).
void FillValidSlots(Case& c, int64_t r, double value, int64_t h = -1) {
  const klref::RefResult ref = klref::ComputeReference(ToReference(c));
  const int64_t L = c.slots();
  for (int64_t j = 0; j < L; ++j) {
    if (!ref.valid[r * L + j]) continue;
    if (h < 0) {
      c.indexer_scores.values[r * L + j] = value;
    } else {
      c.attention_logits->at({r / c.T, h, r % c.T, j}) = value;
    }
  }
}

TEST_P(Validate, RejectsValidRowWhoseScoresAreAllNegativeInfinity) {
  for (InputForm form : kInputForms) {
    for (Flavor flavor : {Flavor::kExact, Flavor::kMaxText}) {
      for (bool drop_row : {false, true}) {
        SCOPED_TRACE(std::string(InputFormName(form)) +
                     (drop_row ? ", row_valid false" : ""));
        Case c = DataBase(form);
        c.options.flavor = flavor;
        const int64_t r = FindSlot(c, true, 5) / c.slots();
        FillValidSlots(c, r, -kInf);
        if (drop_row) c.row_valid->values[r] = 0;
        ExpectValueError(c, "indexer_scores");
      }
    }
  }
}

TEST_P(Validate, RejectsValidRowWhoseZeroTargetHasAllNegativeInfinityScores) {
  // A zero-target row still has valid keys, so its q must exist.
  for (bool sparse : {false, true}) {
    Case c = DataBase(MakeInputForm(sparse, false));
    const int64_t r = FindSlot(c, true, 5) / c.slots();
    for (int64_t j = 0; j < c.slots(); ++j) {
      c.attention_weights->values[r * c.slots() + j] = 0;
    }
    FillValidSlots(c, r, -kInf);
    ExpectValueError(c, "indexer_scores");
  }
}

TEST_P(Validate, RejectsHeadWhoseLogitsAreAllNegativeInfinity) {
  for (bool sparse : {false, true}) {
    for (bool drop_row : {false, true}) {
      Case c = DataBase(MakeInputForm(sparse, true));
      const int64_t r = FindSlot(c, true, 6) / c.slots();
      FillValidSlots(c, r, -kInf, /*h=*/1);  // head 0 stays finite
      if (drop_row) c.row_valid->values[r] = 0;
      ExpectValueError(c, "attention_logits");
    }
  }
}

TEST_P(Validate, RejectsExactNegativeInfinityScoreWhereTargetIsPositive) {
  for (InputForm form : kInputForms) {
    SCOPED_TRACE(InputFormName(form));
    Case c = DataBase(form);
    const int64_t i = FindSlot(c, true, 3);
    c.indexer_scores.values[i] = -kInf;
    c.options.flavor = Flavor::kExact;
    ExpectValueError(c, "indexer_scores");
    // MaxText's epsilon keeps it finite: computed, and as the reference.
    c.options.flavor = Flavor::kMaxText;
    CheckAgainstReference(c);
  }
}

// Flat index of the first valid slot in a row with at least two.
int64_t SlotInRowWithTwoValid(const Case& c) {
  const klref::RefResult ref = klref::ComputeReference(ToReference(c));
  const int64_t L = c.slots();
  for (int64_t r = 0; r < c.num_rows(); ++r) {
    int64_t count = 0, first = -1;
    for (int64_t j = 0; j < L; ++j) {
      if (!ref.valid[r * L + j]) continue;
      if (first < 0) first = r * L + j;
      ++count;
    }
    if (count >= 2) return first;
  }
  ADD_FAILURE() << "no row with two valid slots";
  return 0;
}

// A per-head logit 90 or 100 below its head's maximum gives p of about e^-90
// or e^-100: subnormal floats, but positive, so a score of -inf there is
// EXACT's error as for any p > 0 (the kernels' exp had flushed them to 0,
// and the error went unreported: a helper's finding). From about 103.3 below
// (e^-103.3 = 2^-149, float's least subnormal) p is 0 in float32, and the
// key adds nothing (docs/spec.md), where float64 would still see mass.
TEST_P(Validate, RejectsExactNegativeInfinityScoreWhereTargetIsSubnormal) {
  if (GetParam() == "cuda") {
    GTEST_SKIP() << "the device's subnormal target mass is not yet checked "
                    "on a GPU";
  }
  for (bool sparse : {false, true}) {
    for (double below : {90.0, 100.0, 110.0}) {
      SCOPED_TRACE(absl::StrCat(sparse ? "sparse" : "dense", ", ", below,
                                " below each head's maximum"));
      Case c = DataBase(MakeInputForm(sparse, true));
      c.options.flavor = Flavor::kExact;
      const int64_t i = SlotInRowWithTwoValid(c);
      const klref::RefResult ref = klref::ComputeReference(ToReference(c));
      const int64_t L = c.slots(), r = i / L;
      for (int64_t h = 0; h < c.H; ++h) {
        double m = -kInf;
        for (int64_t j = 0; j < L; ++j) {
          if (ref.valid[r * L + j] && r * L + j != i) {
            m = std::max(m, c.attention_logits->at({r / c.T, h, r % c.T, j}));
          }
        }
        c.attention_logits->at({r / c.T, h, r % c.T, i % L}) = m - below;
      }
      c.indexer_scores.values[i] = -kInf;
      if (below < 103) {
        ExpectValueError(c, "indexer_scores");
      } else {
        EXPECT_TRUE(RunStatus(c).ok()) << RunStatus(c);
      }
    }
  }
}

TEST_P(Validate, AcceptsNegativeInfinityScoreWhereTargetIsZero) {
  for (bool sparse : {false, true}) {
    Case c = DataBase(MakeInputForm(sparse, false));
    const int64_t i = SlotInRowWithTwoValid(c);
    c.indexer_scores.values[i] = -kInf;
    c.attention_weights->values[i] = 0;
    CheckAgainstReference(c);
    // Per-head: p = 0 there when every head's logit is -inf.
    Case h = DataBase(MakeInputForm(sparse, true));
    const int64_t k = SlotInRowWithTwoValid(h);
    h.indexer_scores.values[k] = -kInf;
    SetTarget(h, k, -kInf);
    CheckAgainstReference(h);
  }
}

// The integers in `message`, in order.
std::vector<int64_t> Integers(std::string_view message) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < message.size();) {
    if (message[i] < '0' || message[i] > '9') {
      ++i;
      continue;
    }
    int64_t v = 0;
    while (i < message.size() && message[i] >= '0' && message[i] <= '9') {
      v = v * 10 + (message[i++] - '0');
    }
    out.push_back(v);
  }
  return out;
}

// Expects the message to give the position as consecutive numbers.
void ExpectNamesPosition(const absl::Status& status,
                         const std::vector<int64_t>& position) {
  const std::vector<int64_t> ints = Integers(std::string(status.message()));
  const bool found = std::search(ints.begin(), ints.end(), position.begin(),
                                 position.end()) != ints.end();
  EXPECT_TRUE(found) << "\"" << status.message()
                     << "\" should give the position";
}

TEST_P(Validate, NamesTheFirstBadPosition) {
  for (bool sparse : {false, true}) {
    Case c = DataBase(MakeInputForm(sparse, false));
    c.indexer_scores.at({1, 2, 3}) = kNaN;
    c.indexer_scores.at({1, 3, 4}) = kNaN;
    ExpectNamesPosition(RunStatus(c), {1, 2, 3});
    c = DataBase(MakeInputForm(sparse, false));
    c.attention_weights->at({1, 2, 4}) = -3;
    c.attention_weights->at({1, 3, 0}) = -3;
    ExpectNamesPosition(RunStatus(c), {1, 2, 4});
    if (sparse) {
      c = DataBase(MakeInputForm(sparse, false));
      for (int64_t j = 0; j < 5; ++j) c.topk_indices->at({1, 3, j}) = j;
      c.topk_indices->at({1, 3, 3}) = 1;
      ExpectNamesPosition(RunStatus(c), {1, 3, 3});
    }
  }
}

TEST_P(Validate, ReportsTheLowestBadRow) {
  // Many rows, so that both threads find an error; the lower row wins.
  CaseSpec spec;
  spec.B = 2;
  spec.T = 300;
  spec.S = 8;
  spec.form = InputForm::kDenseAggregated;
  const Case base = MakeRandomCase(spec, 9);
  const int64_t L = base.slots();
  Case c = base;
  c.indexer_scores.values[550 * L + 2] = kNaN;
  c.attention_weights->values[420 * L + 5] = -1;
  ExpectValueError(c, "attention_weights");
  c = base;
  c.indexer_scores.values[30 * L + 2] = kInf;
  c.attention_weights->values[590 * L + 5] = kNaN;
  ExpectValueError(c, "indexer_scores");
}

}  // namespace
}  // namespace klserve::testdata
