#include "tests/kernels/test_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/test_backends.h"

namespace klserve::testdata {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Uniform in [0, 1), independent of the standard library's distributions.
double Uniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1p-53;
}

int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo,hi]
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

double Normal(std::mt19937_64& rng) {
  const double u1 = 1.0 - Uniform(rng);  // (0, 1]
  const double u2 = Uniform(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> choices) {
  return choices.begin()[UniformInt(rng, 0, choices.size() - 1)];
}

// The largest "garbage" magnitude a dtype carries as a finite value.
double Big(DType dtype) { return dtype == DType::kFloat16 ? 3e4 : 1e30; }

std::vector<int64_t> DecodeInts(const std::byte* data, DType dtype,
                                int64_t count) {
  std::vector<int64_t> out(count);
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kInt32) {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      out[i] = v;
    } else {
      out[i] = static_cast<uint8_t>(data[i]);
    }
  }
  return out;
}

std::vector<uint8_t> DecodeBools(const HostTensor& tensor) {
  const std::vector<std::byte> bytes = EncodeTensor(tensor);
  std::vector<uint8_t> out(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[i] = static_cast<uint8_t>(bytes[i]) != 0 ? 1 : 0;
  }
  return out;
}

std::vector<int64_t> DecodeIntTensor(const HostTensor& tensor) {
  const std::vector<std::byte> bytes = EncodeTensor(tensor);
  return DecodeInts(bytes.data(), tensor.dtype, tensor.num_elements());
}

std::vector<double> DecodeFloatTensor(const HostTensor& tensor) {
  const std::vector<std::byte> bytes = EncodeTensor(tensor);
  return DecodeFloats(bytes.data(), tensor.dtype, tensor.num_elements());
}

bool IsFinite(double v) { return std::isfinite(v); }

}  // namespace

// ---------------------------------------------------------------------------
// HostTensor, Case.

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape, double fill)
    : dtype(dtype), shape(std::move(shape)) {
  values.assign(num_elements(), fill);
}

int64_t HostTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double& HostTensor::at(std::initializer_list<int64_t> index) {
  EXPECT_EQ(index.size(), shape.size());
  int64_t flat = 0;
  size_t axis = 0;
  for (int64_t i : index) flat = flat * shape[axis++] + i;
  return values.at(flat);
}

double HostTensor::at(std::initializer_list<int64_t> index) const {
  return const_cast<HostTensor*>(this)->at(index);
}

HostTensor& Case::target() {
  return attention_logits.has_value() ? *attention_logits : *attention_weights;
}

const HostTensor& Case::target() const {
  return attention_logits.has_value() ? *attention_logits : *attention_weights;
}

// ---------------------------------------------------------------------------
// Encoding.

std::vector<std::byte> EncodeTensor(const HostTensor& tensor) {
  const int64_t n = static_cast<int64_t>(tensor.values.size());
  std::vector<std::byte> bytes(n * DTypeSize(tensor.dtype));
  for (int64_t i = 0; i < n; ++i) {
    const double v = tensor.values[i];
    switch (tensor.dtype) {
      case DType::kFloat32: {
        const auto f = static_cast<float>(v);
        std::memcpy(&bytes[4 * i], &f, 4);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t bits = klref::EncodeBFloat16(v);
        std::memcpy(&bytes[2 * i], &bits, 2);
        break;
      }
      case DType::kFloat16: {
        const uint16_t bits = klref::EncodeFloat16(v);
        std::memcpy(&bytes[2 * i], &bits, 2);
        break;
      }
      case DType::kInt32: {
        const auto x = std::isnan(v) ? int32_t{0}
                                     : static_cast<int32_t>(std::clamp(
                                           v, -2147483648.0, 2147483647.0));
        std::memcpy(&bytes[4 * i], &x, 4);
        break;
      }
      case DType::kBool:
        bytes[i] = std::byte{static_cast<uint8_t>(v != 0 ? 1 : 0)};
        break;
    }
  }
  return bytes;
}

std::vector<double> DecodeFloats(const std::byte* data, DType dtype,
                                 int64_t count) {
  std::vector<double> out(count);
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, data + 4 * i, 4);
        out[i] = f;
        break;
      }
      case DType::kBFloat16:
      case DType::kFloat16: {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * i, 2);
        out[i] = dtype == DType::kBFloat16 ? klref::DecodeBFloat16(bits)
                                           : klref::DecodeFloat16(bits);
        break;
      }
      default:
        ADD_FAILURE() << "DecodeFloats: not a float dtype";
        return out;
    }
  }
  return out;
}

int64_t UlpDistance16(uint16_t a, uint16_t b) {
  // Map sign-magnitude to a monotone integer line.
  auto ordered = [](uint16_t x) -> int64_t {
    return (x & 0x8000u) != 0 ? -static_cast<int64_t>(x & 0x7fffu)
                              : static_cast<int64_t>(x);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

EncodedCase::EncodedCase(const Case& c) : options_(c.options) {
  buffers_.reserve(16);
  auto maybe = [this](const std::optional<HostTensor>& t) {
    return t.has_value() ? std::optional<TensorView>(Add(*t)) : std::nullopt;
  };
  inputs_.attention_logits = maybe(c.attention_logits);
  inputs_.attention_weights = maybe(c.attention_weights);
  inputs_.indexer_scores = Add(c.indexer_scores);
  inputs_.topk_indices = maybe(c.topk_indices);
  inputs_.segment_ids_q = maybe(c.segment_ids_q);
  inputs_.segment_ids_kv = maybe(c.segment_ids_kv);
  inputs_.attention_mask = maybe(c.attention_mask);
  inputs_.key_padding_mask = maybe(c.key_padding_mask);
  inputs_.row_valid = maybe(c.row_valid);
}

TensorView EncodedCase::Add(const HostTensor& tensor) {
  buffers_.push_back(EncodeTensor(tensor));
  const std::vector<std::byte>& bytes = buffers_.back();
  TensorView view;
  view.dtype = tensor.dtype;
  view.shape.assign(tensor.shape.begin(), tensor.shape.end());
  // A non-null pointer even for empty tensors.
  view.data = bytes.empty() ? static_cast<const void*>(&buffers_)
                            : static_cast<const void*>(bytes.data());
  view.byte_size = static_cast<int64_t>(bytes.size());
  return view;
}

klref::RefProblem ToReference(const Case& c) {
  klref::RefProblem pr;
  pr.B = c.B;
  pr.T = c.T;
  pr.S = c.S;
  pr.H = c.attention_logits.has_value() ? c.H : 0;
  pr.K = c.K;
  if (c.attention_logits) pr.logits = DecodeFloatTensor(*c.attention_logits);
  if (c.attention_weights) pr.weights = DecodeFloatTensor(*c.attention_weights);
  pr.scores = DecodeFloatTensor(c.indexer_scores);
  if (c.topk_indices) pr.topk = DecodeIntTensor(*c.topk_indices);
  if (c.segment_ids_q) pr.segment_ids_q = DecodeIntTensor(*c.segment_ids_q);
  if (c.segment_ids_kv) pr.segment_ids_kv = DecodeIntTensor(*c.segment_ids_kv);
  if (c.attention_mask) pr.attention_mask = DecodeBools(*c.attention_mask);
  if (c.key_padding_mask)
    pr.key_padding_mask = DecodeBools(*c.key_padding_mask);
  if (c.row_valid) pr.row_valid = DecodeBools(*c.row_valid);
  pr.causal = c.options.causal;
  pr.q_offset = c.options.q_offset;
  pr.softmax_scale = static_cast<double>(c.options.softmax_scale);
  pr.flavor = c.options.flavor == Flavor::kMaxText ? klref::RefFlavor::kMaxText
                                                   : klref::RefFlavor::kExact;
  switch (c.options.reduction) {
    case Reduction::kMean:
      pr.reduction = klref::RefReduction::kMean;
      break;
    case Reduction::kMeanValid:
      pr.reduction = klref::RefReduction::kMeanValid;
      break;
    case Reduction::kSum:
      pr.reduction = klref::RefReduction::kSum;
      break;
  }
  pr.scaling_factor = c.options.scaling_factor;
  pr.grad_scale = c.options.grad_scale;
  pr.recall_k = c.options.recall_k;
  return pr;
}

// ---------------------------------------------------------------------------
// Running the library.

namespace {
cpu::Isa& TestIsaSetting() {
  static cpu::Isa isa = cpu::BestIsa();
  return isa;
}
}  // namespace

cpu::Isa TestIsa() { return TestIsaSetting(); }
void SetTestIsa(cpu::Isa isa) { TestIsaSetting() = isa; }

Backend& SharedBackend() {
  static CpuBackend* const backend = new CpuBackend(2, TestIsa());
  return *backend;
}

LibOutput RunLibrary(const Case& c, Backend* backend) {
  LibOutput out;
  EncodedCase encoded(c);
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
  const int64_t elements = c.num_rows() * c.slots();
  LossOutputs outputs;
  if (c.options.want_grad) {
    // All-ones bytes are NaN in every float format: elements the library
    // does not write stand out.
    out.grad_bytes.assign(elements * DTypeSize(c.options.grad_dtype),
                          std::byte{0xff});
    outputs.grad = out.grad_bytes.data();
    outputs.grad_byte_size = static_cast<int64_t>(out.grad_bytes.size());
  }
  if (c.options.want_row_kl) {
    out.row_kl.assign(c.num_rows(), kNaN);
    outputs.row_kl = out.row_kl.data();
    outputs.row_kl_size = c.num_rows();
  }
  absl::StatusOr<IndexerKlResult> result =
      ComputeIndexerKl(backend != nullptr ? *backend : BackendUnderTest(),
                       *problem, *rows, outputs);
  if (!result.ok()) {
    out.status = result.status();
    return out;
  }
  out.result = *result;
  if (c.options.want_grad) {
    out.grad =
        DecodeFloats(out.grad_bytes.data(), c.options.grad_dtype, elements);
  }
  return out;
}

double LibraryLoss(const Case& c, Backend* backend) {
  Case copy = c;
  copy.options.want_grad = false;
  copy.options.want_row_kl = false;
  copy.options.want_diagnostics = false;
  const LibOutput out = RunLibrary(copy, backend);
  if (!out.status.ok()) return kNaN;
  return out.result.loss;
}

absl::Status CreateStatus(const EncodedCase& encoded) {
  const absl::StatusOr<IndexerKlProblem> problem =
      IndexerKlProblem::Create(encoded.inputs(), encoded.options());
  if (!problem.ok()) return problem.status();
  return WholeRowData(*problem, encoded.inputs()).status();
}

absl::Status RunStatus(const Case& c) { return RunLibrary(c).status; }

// ---------------------------------------------------------------------------
// Random cases.

IndexerKlOptions CaseSpec::DefaultOptions() {
  IndexerKlOptions options;
  options.want_row_kl = true;
  options.want_diagnostics = true;
  options.recall_k = 3;
  return options;
}

Case MakeRandomCase(const CaseSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  c.B = spec.B;
  c.T = spec.T;
  c.S = spec.S;
  c.H = IsPerHead(spec.form) ? spec.H : 0;
  c.K = IsSparse(spec.form) ? spec.K : 0;
  EXPECT_EQ(c.sparse(), IsSparse(spec.form)) << "a sparse form needs K > 0";
  c.options = spec.options;
  c.options.causal = spec.causal;
  c.options.q_offset = spec.q_offset;
  if (c.sparse()) c.options.num_keys = spec.S;
  const int64_t B = c.B, T = c.T, S = c.S, L = c.slots();

  if (spec.segments) {
    // Packed documents: runs of ids, with some keys never attended (-1).
    c.segment_ids_q = HostTensor(DType::kInt32, {B, T});
    c.segment_ids_kv = HostTensor(DType::kInt32, {B, S});
    for (int64_t b = 0; b < B; ++b) {
      int64_t id = 0;
      for (int64_t t = 0; t < T; ++t) {
        if (Uniform(rng) < 0.25) id = (id + 1) % 3;
        c.segment_ids_q->at({b, t}) = Uniform(rng) < 0.05 ? -1 : id;
      }
      id = 0;
      for (int64_t s = 0; s < S; ++s) {
        if (Uniform(rng) < 0.25) id = (id + 1) % 3;
        const double u = Uniform(rng);
        c.segment_ids_kv->at({b, s}) = u < 0.08 ? -1 : u < 0.12 ? -7 : id;
      }
    }
  }
  if (spec.attention_mask) {
    c.attention_mask = HostTensor(DType::kBool, {B, T, S});
    for (double& v : c.attention_mask->values) v = Uniform(rng) < 0.75;
  }
  if (spec.key_padding) {
    c.key_padding_mask = HostTensor(DType::kBool, {B, S});
    for (double& v : c.key_padding_mask->values) v = Uniform(rng) < 0.85;
  }
  if (spec.row_valid) {
    c.row_valid = HostTensor(DType::kBool, {B, T});
    for (double& v : c.row_valid->values) v = Uniform(rng) < 0.8;
  }
  if (c.sparse()) {
    c.topk_indices = HostTensor(DType::kInt32, {B, T, c.K});
    std::vector<int64_t> keys(S);
    // An empty slot is -1 mostly, and any other index outside [0, S) at
    // times: both name no key. Chosen by position, not drawn, so that the
    // cases' other values do not depend on it.
    const double kInt32Min = std::numeric_limits<int32_t>::min();
    const double kInt32Max = std::numeric_limits<int32_t>::max();
    const double empties[] = {-1, -1,        static_cast<double>(S),
                              -1, -2,        kInt32Max,
                              -1, kInt32Min, S + 5.0};
    for (int64_t r = 0; r < B * T; ++r) {
      std::iota(keys.begin(), keys.end(), 0);
      std::shuffle(keys.begin(), keys.end(), rng);
      int64_t next = 0;
      for (int64_t j = 0; j < c.K; ++j) {
        const bool empty = next >= S || Uniform(rng) < spec.empty_slot_fraction;
        const int64_t at = r * c.K + j;
        c.topk_indices->values[at] = empty ? empties[at % std::size(empties)]
                                           : static_cast<double>(keys[next++]);
      }
    }
  }

  // Neutral values first, to learn which slots are valid.
  c.indexer_scores = HostTensor(spec.scores_dtype, {B, T, L});
  if (IsPerHead(spec.form)) {
    c.attention_logits = HostTensor(spec.target_dtype, {B, spec.H, T, L});
  } else {
    c.attention_weights = HostTensor(spec.target_dtype, {B, T, L}, 1.0);
  }
  const klref::RefResult neutral = klref::ComputeReference(ToReference(c));
  EXPECT_EQ(neutral.error, "");
  const std::vector<uint8_t>& valid = neutral.valid;

  const double big_scores = Big(spec.scores_dtype);
  const double big_target = Big(spec.target_dtype);
  auto garbage = [&](double big) {
    return Pick(rng, {-kInf, big, -big, 0.5 * Normal(rng)});
  };
  for (int64_t i = 0; i < B * T * L; ++i) {
    if (valid[i] || !spec.garbage_at_invalid) {
      c.indexer_scores.values[i] = spec.score_spread * Normal(rng);
    } else {
      c.indexer_scores.values[i] = garbage(big_scores);
    }
  }
  if (IsPerHead(spec.form)) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < spec.H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t j = 0; j < L; ++j) {
            const int64_t i = (b * T + t) * L + j;
            c.attention_logits->at({b, h, t, j}) =
                valid[i] || !spec.garbage_at_invalid
                    ? spec.logit_spread * Normal(rng)
                    : garbage(big_target);
          }
        }
      }
    }
  } else {
    for (int64_t i = 0; i < B * T * L; ++i) {
      double& w = c.attention_weights->values[i];
      if (valid[i] || !spec.garbage_at_invalid) {
        w = Uniform(rng) < spec.zero_weight_fraction
                ? 0.0
                : std::exp(1.5 * Normal(rng));
      } else {
        w = Pick(rng, {0.0, big_target, 3.0});
      }
    }
  }
  return c;
}

CaseSpec RandomSpec(std::mt19937_64& rng) {
  CaseSpec spec;
  spec.B = UniformInt(rng, 1, 3);
  spec.T = UniformInt(rng, 1, 12);
  spec.S = UniformInt(rng, 1, 40);
  const bool per_head = Uniform(rng) < 0.5;
  spec.H = UniformInt(rng, 1, 8);
  const bool sparse = Uniform(rng) < 0.5;
  if (sparse) spec.K = UniformInt(rng, 1, spec.S + 4);
  spec.form = MakeInputForm(sparse, per_head);
  const std::initializer_list<DType> floats = {
      DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  spec.target_dtype = Pick(rng, floats);
  spec.scores_dtype = Pick(rng, floats);
  spec.causal = Uniform(rng) < 0.4;
  if (spec.causal && Uniform(rng) < 0.6) {
    spec.q_offset = UniformInt(rng, -3, spec.S);
  }
  spec.segments = Uniform(rng) < 0.3;
  spec.attention_mask = Uniform(rng) < 0.3;
  spec.key_padding = Uniform(rng) < 0.3;
  spec.row_valid = Uniform(rng) < 0.3;
  spec.logit_spread = Pick(rng, {0.5, 3.0, 8.0});
  spec.score_spread = Pick(rng, {0.5, 2.0, 6.0});
  IndexerKlOptions& o = spec.options;
  o.flavor = Uniform(rng) < 0.5 ? Flavor::kExact : Flavor::kMaxText;
  o.reduction =
      Pick(rng, {Reduction::kMean, Reduction::kMeanValid, Reduction::kSum});
  o.scaling_factor = Pick(rng, {1.0, 0.01, 0.0, 2.5});
  o.grad_dtype = Pick(rng, floats);
  o.softmax_scale = Pick(rng, {1.0f, 0.125f, 0.7f});
  // A scale applies to logits only (weights with another are refused).
  if (!IsPerHead(spec.form)) o.softmax_scale = 1.0f;
  o.recall_k = Pick(rng, {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{50}});
  return spec;
}

std::string Describe(const CaseSpec& s) {
  std::ostringstream out;
  out << "B=" << s.B << " T=" << s.T << " S=" << s.S
      << (IsPerHead(s.form) ? absl::StrCat(" per-head H=", s.H) : " aggregated")
      << (IsSparse(s.form) ? absl::StrCat(" sparse K=", s.K) : " dense")
      << " target=" << DTypeName(s.target_dtype)
      << " scores=" << DTypeName(s.scores_dtype);
  if (s.causal) {
    out << " causal";
    if (s.q_offset) out << "(q_offset=" << *s.q_offset << ")";
  }
  if (s.segments) out << " segments";
  if (s.attention_mask) out << " attention_mask";
  if (s.key_padding) out << " key_padding";
  if (s.row_valid) out << " row_valid";
  const IndexerKlOptions& o = s.options;
  out << (o.flavor == Flavor::kExact ? " EXACT" : " MAXTEXT")
      << (o.reduction == Reduction::kMean        ? " MEAN"
          : o.reduction == Reduction::kMeanValid ? " MEAN_VALID"
                                                 : " SUM")
      << " c=" << o.scaling_factor << " scale=" << o.softmax_scale
      << " grad=" << DTypeName(o.grad_dtype) << " recall_k=" << o.recall_k;
  return out.str();
}

// ---------------------------------------------------------------------------
// Comparisons.

void ExpectMatchesReference(const Case& c, const LibOutput& lib,
                            const klref::RefResult& ref, const Tolerance& tol) {
  ASSERT_TRUE(lib.status.ok()) << lib.status;
  ASSERT_EQ(ref.error, "") << "the reference rejects the case";
  const IndexerKlResult& r = lib.result;
  EXPECT_EQ(r.denominator, ref.denominator);
  EXPECT_EQ(r.rows_counted, ref.rows_counted);
  EXPECT_EQ(r.rows_fully_masked, ref.rows_fully_masked);
  EXPECT_EQ(r.rows_zero_target, ref.rows_zero_target);

  // Float32 element math with float64 sums: about 1e-6 per row at worst.
  const double n = std::max<int64_t>(ref.denominator, 1);
  const double floor = 1e-6 * ref.rows_counted / n + 1e-12;
  const double c_abs = std::fabs(c.options.scaling_factor);
  EXPECT_TRUE(IsFinite(r.loss)) << r.loss;
  EXPECT_TRUE(IsFinite(r.unscaled_loss)) << r.unscaled_loss;
  EXPECT_NEAR(r.unscaled_loss, ref.unscaled_loss,
              tol.loss_rel * std::fabs(ref.unscaled_loss) + floor);
  EXPECT_NEAR(r.loss, ref.loss,
              tol.loss_rel * std::fabs(ref.loss) + c_abs * floor);

  if (c.options.want_row_kl) {
    ASSERT_EQ(lib.row_kl.size(), ref.row_kl.size());
    int failures = 0;
    for (size_t i = 0; i < ref.row_kl.size() && failures < 5; ++i) {
      const double want = ref.row_kl[i], got = lib.row_kl[i];
      const bool ok =
          IsFinite(got) &&
          std::fabs(got - want) <= tol.loss_rel * std::fabs(want) + 1e-6 &&
          (ref.row_counted[i] || got == 0);
      if (!ok) {
        ++failures;
        ADD_FAILURE() << "row_kl[" << i << "]: got " << got << ", want " << want
                      << (ref.row_counted[i] ? "" : " (row not counted)");
      }
    }
  }

  if (c.options.want_grad) {
    const int64_t L = c.slots();
    ASSERT_EQ(lib.grad.size(), ref.grad.size());
    double max_abs = 0;
    for (double g : ref.grad) max_abs = std::max(max_abs, std::fabs(g));
    // q and p are at most 1, so float32 math is good to ~1e-6 * c / N even
    // where the reference gradient is (nearly) zero everywhere.
    const double grad_floor = 1e-6 * c_abs / n;
    const DType gd = c.options.grad_dtype;
    const bool half = gd != DType::kFloat32;
    int failures = 0;
    for (size_t i = 0; i < ref.grad.size() && failures < 5; ++i) {
      const double want = ref.grad[i], got = lib.grad[i];
      const bool must_be_zero =
          ref.valid[i] == 0 || ref.row_counted[i / L] == 0;
      bool ok;
      if (!IsFinite(got)) {
        ok = false;
      } else if (must_be_zero) {
        ok = got == 0;
      } else if (!half) {
        ok = std::fabs(got - want) <= tol.grad_rel * max_abs + grad_floor;
      } else {
        // The library rounds its float32 value; allow one 16-bit ulp from
        // the correctly rounded reference, or float32-level closeness.
        uint16_t bits;
        std::memcpy(&bits, &lib.grad_bytes[2 * i], 2);
        const uint16_t want_bits = gd == DType::kBFloat16
                                       ? klref::EncodeBFloat16(want)
                                       : klref::EncodeFloat16(want);
        ok = UlpDistance16(bits, want_bits) <= 1 ||
             std::fabs(got - want) <= 2e-5 * max_abs + grad_floor;
      }
      if (!ok) {
        ++failures;
        ADD_FAILURE() << "grad[" << i << "] (row " << i / L << ", slot "
                      << i % L << "): got " << got << ", want " << want
                      << " (max-abs " << max_abs << ", grad dtype "
                      << DTypeName(gd) << ")";
      }
    }
  }

  if (c.options.want_diagnostics) {
    ASSERT_TRUE(r.diagnostics.has_value());
    const Diagnostics& d = *r.diagnostics;
    EXPECT_TRUE(IsFinite(d.mean_entropy_p) && IsFinite(d.mean_entropy_q));
    if (tol.compare_diagnostics) {
      EXPECT_NEAR(d.mean_entropy_p, ref.mean_entropy_p,
                  1e-5 * std::fabs(ref.mean_entropy_p) + 1e-6);
      EXPECT_NEAR(d.mean_entropy_q, ref.mean_entropy_q,
                  1e-5 * std::fabs(ref.mean_entropy_q) + 1e-6);
    }
    if (c.options.recall_k > 0) {
      ASSERT_TRUE(d.topk_recall.has_value());
      EXPECT_TRUE(IsFinite(*d.topk_recall));
      if (tol.compare_diagnostics &&
          !(tol.sparse_recall_ties_by_slot && ref.recall_tie_sparse)) {
        EXPECT_NEAR(*d.topk_recall, ref.topk_recall, 1e-5);
      }
    } else {
      EXPECT_FALSE(d.topk_recall.has_value());
    }
  } else {
    EXPECT_FALSE(r.diagnostics.has_value());
  }
}

klref::RefResult CheckAgainstReference(const Case& c, const Tolerance& tol,
                                       Backend* backend) {
  const LibOutput lib = RunLibrary(c, backend);
  klref::RefResult ref = klref::ComputeReference(ToReference(c));
  Tolerance backend_tol = tol;
  backend_tol.sparse_recall_ties_by_slot =
      backend != nullptr && backend->name() == "cuda";
  ExpectMatchesReference(c, lib, ref, backend_tol);
  return ref;
}

namespace {

bool NamesField(std::string_view message, std::string_view field,
                bool at_start) {
  auto is_word = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '_';
  };
  size_t pos = message.find(field);
  while (pos != std::string_view::npos) {
    const size_t end = pos + field.size();
    const bool starts_word = pos == 0 || !is_word(message[pos - 1]);
    const bool ends_word = end == message.size() || !is_word(message[end]);
    if (starts_word && ends_word) return !at_start || pos == 0;
    if (at_start) return false;
    pos = message.find(field, pos + 1);
  }
  return false;
}

void ExpectInvalid(const absl::Status& status,
                   std::initializer_list<std::string_view> fields,
                   bool at_start) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  const std::string message(status.message());
  bool named = false;
  std::string wanted;
  for (std::string_view field : fields) {
    named = named || NamesField(message, field, at_start);
    wanted += " ";
    wanted += field;
  }
  EXPECT_TRUE(named) << "message \"" << message << "\" should "
                     << (at_start ? "start with" : "name")
                     << " one of:" << wanted;
}

}  // namespace

void ExpectInvalidStartingWith(const absl::Status& status,
                               std::initializer_list<std::string_view> fields) {
  ExpectInvalid(status, fields, /*at_start=*/true);
}

void ExpectInvalidNaming(const absl::Status& status,
                         std::initializer_list<std::string_view> fields) {
  ExpectInvalid(status, fields, /*at_start=*/false);
}

}  // namespace klserve::testdata
