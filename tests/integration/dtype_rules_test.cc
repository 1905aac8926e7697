// The tensor table's dtype rules (proto/request_tensors.h, from
// kernels/input_dtypes.h), which klctl's help, the clients and the stream
// slicer read, against the checks the kernels make (kernels/problem.cc,
// kernels/projections_problem.cc), over the real server: every tensor of
// every form, sent in each wire dtype, is served when its rule takes the
// dtype and refused naming the tensor and its dtype when not. A table entry
// or a check that names another input's rule fails here, and so does a rule
// that takes other dtypes than this test's own list says.

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "kernels/shape_bytes.h"
#include "klserve/v1/klserve.pb.h"
#include "proto/request_tensors.h"
#include "tests/integration/harness.h"
#include "tests/integration/reference_problems.h"

namespace klserve::integration {
namespace {

// The dtypes each tensor takes, written here by name from the contract
// (docs/spec.md), apart from the one rule the table and the kernels read.
bool Takes(absl::string_view tensor, DType dtype) {
  if (tensor == "lse") return dtype == DType::kFloat32;
  if (tensor == "topk_indices" || tensor == "segment_ids_q" ||
      tensor == "segment_ids_kv" || tensor == "key_start" ||
      tensor == "key_end") {
    return dtype == DType::kInt32;
  }
  if (tensor == "attention_mask" || tensor == "key_padding_mask" ||
      tensor == "row_valid") {
    return dtype == DType::kBool;
  }
  return IsFloatDType(dtype);
}

int64_t NumElements(const v1::Tensor& tensor) {
  return *ShapeBytes(1, tensor.shape());
}

// `tensor` in `dtype`: float values converted to another float dtype (so
// that the request stays valid), any other change as zero bytes of the
// dtype's size.
v1::Tensor InDType(const v1::Tensor& tensor, DType dtype) {
  v1::Tensor out = tensor;
  out.set_dtype(DTypeName(dtype));
  const bool floats = tensor.dtype() == "FP32" || tensor.dtype() == "BF16" ||
                      tensor.dtype() == "FP16";
  if (floats && IsFloatDType(dtype)) {
    std::vector<float> values(NumElements(tensor));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = GetFloat(tensor, static_cast<int64_t>(i));
    }
    out.set_data(EncodeFloats(values, DTypeName(dtype)));
  } else {
    out.set_data(std::string(NumElements(tensor) * DTypeSize(dtype), '\0'));
  }
  return out;
}

// Adds every tensor that `form` takes, `request` lacks, and whose layout
// has the letters B, T and S only (the masks, segment ids and key bounds),
// with values that keep the request valid: every key allowed, every row
// counted, one segment, bounds [0, S).
void AddTheSmallTensors(RequestForm form, int64_t B, int64_t T, int64_t S,
                        v1::ComputeLossRequest& request) {
  for (const RequestTensor& entry : kRequestTensors) {
    if (!TakenIn(form, entry) || FindTensor(request, entry) != nullptr) {
      continue;
    }
    std::vector<int64_t> shape;
    if (entry.layout == "[B, T]") {
      shape = {B, T};
    } else if (entry.layout == "[B, S]") {
      shape = {B, S};
    } else if (entry.layout == "[B, T, S]") {
      shape = {B, T, S};
    } else {
      continue;
    }
    v1::Tensor& tensor = *MutableTensor(request, entry);
    for (const int64_t d : shape) tensor.add_shape(d);
    const int64_t n = shape.size() == 2 ? shape[0] * shape[1]
                                        : shape[0] * shape[1] * shape[2];
    if (entry.dtype == DTypeRule::kBool) {
      tensor.set_dtype("BOOL");
      tensor.set_data(std::string(n, '\1'));
    } else {
      const int32_t value = entry.name == "key_end" ? S : 0;
      tensor = Int32Tensor(shape, std::vector<int32_t>(n, value));
    }
  }
}

class DTypeRulesTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  // Sends `request` with each of its tensors in each wire dtype; records
  // the (tensor, form) pairs it tried.
  void CheckEveryTensorOf(const v1::ComputeLossRequest& request,
                          const std::string& what) {
    const RequestForm form = FormOf(request);
    {
      const absl::StatusOr<v1::ComputeLossResponse> as_built =
          client().ComputeLossUnary(request);
      ASSERT_TRUE(as_built.ok()) << what << ": " << as_built.status();
    }
    for (const RequestTensor& entry : kRequestTensors) {
      const v1::Tensor* tensor = FindTensor(request, entry);
      if (tensor == nullptr) continue;
      tried_.insert({std::string(entry.name), form});
      for (const DType dtype : kWireDTypes) {
        if (tensor->dtype() == DTypeName(dtype)) continue;
        v1::ComputeLossRequest changed = request;
        *MutableTensor(changed, entry) = InDType(*tensor, dtype);
        // The lse of the rounded projections: the given one is checked
        // against the attention's mass, which rounding moves.
        if (changed.has_lse() && entry.name != "lse" && IsFloatDType(dtype)) {
          *changed.mutable_lse() = LseOf(RefProjectionsOf(changed));
        }
        const absl::StatusOr<v1::ComputeLossResponse> answer =
            client().ComputeLossUnary(changed);
        const std::string context =
            absl::StrCat(what, ", ", entry.name, " in ", DTypeName(dtype));
        if (Takes(entry.name, dtype)) {
          EXPECT_TRUE(answer.ok()) << context << ": " << answer.status();
        } else {
          ASSERT_FALSE(answer.ok()) << context;
          EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument)
              << context << ": " << answer.status();
          EXPECT_TRUE(absl::StartsWith(answer.status().message(),
                                       absl::StrCat(entry.name, ": dtype")))
              << context << ": " << answer.status();
        }
      }
    }
  }

  std::set<std::pair<std::string, RequestForm>> tried_;
};

TEST_F(DTypeRulesTest, EveryTensorTakesTheDTypesOfItsRuleAndNoOther) {
  ProblemSpec per_head;
  per_head.name = "dense per-head";
  per_head.B = 2, per_head.T = 4, per_head.S = 8, per_head.H = 2;
  v1::ComputeLossRequest dense = MakeRequest(per_head);
  AddTheSmallTensors(RequestForm::kLogits, 2, 4, 8, dense);
  CheckEveryTensorOf(dense, per_head.name);

  ProblemSpec weights;
  weights.name = "sparse weights";
  weights.B = 2, weights.T = 4, weights.S = 8, weights.H = 0, weights.K = 4;
  CheckEveryTensorOf(MakeRequest(weights), weights.name);

  ProjectionsSpec projections;
  projections.name = "projections";
  projections.B = 2, projections.T = 6, projections.S = 6, projections.K = 3;
  v1::ComputeLossRequest from_projections = MakeProjectionsRequest(projections);
  AddTheSmallTensors(RequestForm::kProjections, 2, 6, 6, from_projections);
  CheckEveryTensorOf(from_projections, projections.name);

  ProjectionsSpec dense_projections;
  dense_projections.name = "dense projections with lse";
  v1::ComputeLossRequest with_lse = MakeProjectionsRequest(dense_projections);
  *with_lse.mutable_lse() = LseOf(RefProjectionsOf(with_lse));
  CheckEveryTensorOf(with_lse, dense_projections.name);

  for (const RequestTensor& entry : kRequestTensors) {
    for (const RequestForm form :
         {RequestForm::kLogits, RequestForm::kProjections}) {
      if (TakenIn(form, entry)) {
        EXPECT_TRUE(tried_.contains({std::string(entry.name), form}))
            << entry.name << " was not tried in the "
            << (form == RequestForm::kLogits ? "logits" : "projections")
            << " form";
      }
    }
  }
}

}  // namespace
}  // namespace klserve::integration
