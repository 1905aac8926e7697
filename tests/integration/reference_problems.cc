#include "tests/integration/reference_problems.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace klserve::integration {
namespace {

uint16_t Half(const std::string& data, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, data.data() + 2 * i, 2);
  return bits;
}

std::vector<uint8_t> DecodeBools(const v1::Tensor& tensor) {
  return std::vector<uint8_t>(tensor.data().begin(), tensor.data().end());
}

klref::RefFlavor FlavorOf(const v1::LossOptions& o) {
  return o.flavor() == v1::FLAVOR_MAXTEXT ? klref::RefFlavor::kMaxText
                                          : klref::RefFlavor::kExact;
}

klref::RefReduction ReductionOf(const v1::LossOptions& o) {
  switch (o.reduction()) {
    case v1::REDUCTION_MEAN_VALID:
      return klref::RefReduction::kMeanValid;
    case v1::REDUCTION_SUM:
      return klref::RefReduction::kSum;
    default:
      return klref::RefReduction::kMean;
  }
}

// The masks and options every form shares.
klref::RefProblem SharedPartOf(const v1::ComputeLossRequest& request) {
  klref::RefProblem p;
  const v1::LossOptions& o = request.options();
  p.causal = o.causal();
  if (o.has_q_offset()) p.q_offset = o.q_offset();
  if (o.has_softmax_scale()) p.softmax_scale = o.softmax_scale();
  p.flavor = FlavorOf(o);
  p.reduction = ReductionOf(o);
  if (o.has_scaling_factor()) p.scaling_factor = o.scaling_factor();
  if (o.has_grad_scale()) p.grad_scale = o.grad_scale();
  p.recall_k = o.recall_k();
  if (request.has_segment_ids_q()) {
    p.segment_ids_q = DecodeInts(request.segment_ids_q());
    p.segment_ids_kv = DecodeInts(request.segment_ids_kv());
  }
  if (request.has_attention_mask()) {
    p.attention_mask = DecodeBools(request.attention_mask());
  }
  if (request.has_key_padding_mask()) {
    p.key_padding_mask = DecodeBools(request.key_padding_mask());
  }
  if (request.has_row_valid()) p.row_valid = DecodeBools(request.row_valid());
  if (request.has_key_start()) {
    p.key_start = DecodeInts(request.key_start());
    p.key_end = DecodeInts(request.key_end());
  }
  return p;
}

}  // namespace

std::vector<double> DecodeFloats(const v1::Tensor& tensor) {
  const std::string& data = tensor.data();
  std::vector<double> out;
  if (tensor.dtype() == "FP32") {
    out.resize(data.size() / 4);
    for (size_t i = 0; i < out.size(); ++i) {
      float value;
      std::memcpy(&value, data.data() + 4 * i, 4);
      out[i] = value;
    }
  } else if (tensor.dtype() == "FP64") {
    out.resize(data.size() / 8);
    std::memcpy(out.data(), data.data(), data.size());
  } else {
    const bool bf16 = tensor.dtype() == "BF16";
    out.resize(data.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = bf16 ? klref::DecodeBFloat16(Half(data, i))
                    : klref::DecodeFloat16(Half(data, i));
    }
  }
  return out;
}

std::vector<int64_t> DecodeInts(const v1::Tensor& tensor) {
  std::vector<int64_t> out(tensor.data().size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    int32_t value;
    std::memcpy(&value, tensor.data().data() + 4 * i, 4);
    out[i] = value;
  }
  return out;
}

klref::RefProblem RefProblemOf(const v1::ComputeLossRequest& request) {
  klref::RefProblem p = SharedPartOf(request);
  const v1::Tensor& scores = request.indexer_scores();
  p.B = scores.shape(0);
  p.T = scores.shape(1);
  p.S = request.has_topk_indices() ? request.options().num_keys()
                                   : scores.shape(2);
  p.K = request.has_topk_indices() ? scores.shape(2) : 0;
  p.scores = DecodeFloats(scores);
  if (request.has_attention_logits()) {
    p.H = request.attention_logits().shape(1);
    p.logits = DecodeFloats(request.attention_logits());
  } else {
    p.weights = DecodeFloats(request.attention_weights());
  }
  if (request.has_topk_indices()) p.topk = DecodeInts(request.topk_indices());
  return p;
}

klref::RefProjections RefProjectionsOf(const v1::ComputeLossRequest& request) {
  klref::RefProjections p;
  p.options = SharedPartOf(request);
  const v1::Tensor& query = request.query();
  p.B = query.shape(0);
  p.T = query.shape(1);
  p.H = query.shape(2);
  p.D = query.shape(3);
  p.S = request.key().shape(1);
  p.H_kv = request.key().shape(2);
  p.H_I = request.index_query().shape(2);
  p.D_I = request.index_query().shape(3);
  p.query = DecodeFloats(query);
  p.key = DecodeFloats(request.key());
  p.index_query = DecodeFloats(request.index_query());
  p.index_key = DecodeFloats(request.index_key());
  p.index_weights = DecodeFloats(request.index_weights());
  const v1::LossOptions& o = request.options();
  if (o.has_index_weight_scale()) p.index_weight_scale = o.index_weight_scale();
  if (o.has_use_relu()) p.use_relu = o.use_relu();
  if (request.has_topk_indices()) {
    p.topk_indices = DecodeInts(request.topk_indices());
    p.K = request.topk_indices().shape(2);
  } else {
    p.K = o.topk();
  }
  return p;
}

::testing::AssertionResult CloseTensor(const std::vector<double>& expected,
                                       const v1::Tensor& actual,
                                       double tolerance) {
  const std::vector<double> got = DecodeFloats(actual);
  if (got.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << got.size() << " elements, want " << expected.size();
  }
  double max_abs = 0;
  for (double e : expected) max_abs = std::max(max_abs, std::fabs(e));
  const double allowed = tolerance * max_abs + 1e-12;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - expected[i]) <= allowed)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << ", want " << expected[i]
             << " (within " << allowed << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult CloseResult(const klref::RefResult& expected,
                                       const v1::ComputeLossResponse& actual,
                                       double tolerance) {
  const v1::LossResult& r = actual.result();
  const auto close = [&](double got, double want) {
    return std::fabs(got - want) <= tolerance * std::fabs(want) + 1e-9;
  };
  if (!expected.error.empty()) {
    return ::testing::AssertionFailure()
           << "the reference finds an error in " << expected.error;
  }
  if (!close(r.loss(), expected.loss) ||
      !close(r.unscaled_loss(), expected.unscaled_loss)) {
    return ::testing::AssertionFailure()
           << "loss " << r.loss() << " / unscaled " << r.unscaled_loss()
           << ", want " << expected.loss << " / " << expected.unscaled_loss;
  }
  if (r.denominator() != expected.denominator ||
      r.rows_counted() != expected.rows_counted ||
      r.rows_fully_masked() != expected.rows_fully_masked ||
      r.rows_zero_target() != expected.rows_zero_target) {
    return ::testing::AssertionFailure()
           << "N, counted, fully masked, zero target: " << r.denominator()
           << ", " << r.rows_counted() << ", " << r.rows_fully_masked() << ", "
           << r.rows_zero_target() << "; want " << expected.denominator << ", "
           << expected.rows_counted << ", " << expected.rows_fully_masked
           << ", " << expected.rows_zero_target;
  }
  if (actual.has_row_kl()) {
    const std::vector<double> row_kl = DecodeFloats(actual.row_kl());
    if (row_kl.size() != expected.row_kl.size()) {
      return ::testing::AssertionFailure()
             << "row_kl has " << row_kl.size() << " rows, want "
             << expected.row_kl.size();
    }
    for (size_t i = 0; i < row_kl.size(); ++i) {
      if (!(std::fabs(row_kl[i] - expected.row_kl[i]) <=
            tolerance * std::fabs(expected.row_kl[i]) + 1e-6)) {
        return ::testing::AssertionFailure()
               << "row_kl[" << i << "] " << row_kl[i] << ", want "
               << expected.row_kl[i];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

double GradTolerance(const std::string& grad_dtype) {
  if (grad_dtype == "BF16") return 1e-2;
  if (grad_dtype == "FP16") return 2e-3;
  return 1e-4;
}

v1::Tensor LseOf(const klref::RefProjections& p) {
  const klref::RefProblem logits = klref::LogitsFormOf(p, {});
  const klref::RefResult dense = klref::ComputeReference(logits);
  std::vector<float> lse(p.B * p.H * p.T, 0.0f);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      for (int64_t t = 0; t < p.T; ++t) {
        const int64_t r = b * p.T + t;
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < p.S; ++s) {
          if (!dense.valid[r * p.S + s]) continue;
          max = std::max(
              max, p.options.softmax_scale *
                       logits.logits[((b * p.H + h) * p.T + t) * p.S + s]);
        }
        if (std::isinf(max)) continue;
        double sum = 0;
        for (int64_t s = 0; s < p.S; ++s) {
          if (!dense.valid[r * p.S + s]) continue;
          sum +=
              std::exp(p.options.softmax_scale *
                           logits.logits[((b * p.H + h) * p.T + t) * p.S + s] -
                       max);
        }
        lse[(b * p.H + h) * p.T + t] = static_cast<float>(max + std::log(sum));
      }
    }
  }
  v1::Tensor t;
  t.set_dtype("FP32");
  for (int64_t d : {p.B, p.H, p.T}) t.add_shape(d);
  t.mutable_data()->resize(lse.size() * sizeof(float));
  std::memcpy(t.mutable_data()->data(), lse.data(), t.data().size());
  return t;
}

}  // namespace klserve::integration
