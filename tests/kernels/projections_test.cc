// The projections form against the float64 reference
// (tests/reference/projections_reference.h): dense and sparse (the client's
// indices and the service's selection), both flavours, every reduction,
// MHA/GQA/MQA, with and without lse, relu on and off, masks and key bounds,
// 16-bit inputs; the same bits whatever the thread count; and every
// validation error.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/projections_computation.h"
#include "kernels/projections_loss.h"
#include "kernels/projections_problem.h"
#include "tests/kernels/test_data.h"
#include "tests/reference/projections_reference.h"

namespace klserve {
namespace {

using klref::RefFlavor;
using klref::RefProjections;
using klref::RefReduction;
using testdata::DecodeFloats;
using testdata::EncodeTensor;
using testdata::HostTensor;

std::vector<double> Random(std::mt19937_64& rng, int64_t n, double scale) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

// A random problem; values are rounded to `dtype` here, so that the
// reference sees exactly what the library reads.
RefProjections RandomProblem(uint64_t seed, int64_t B, int64_t T, int64_t S,
                             int64_t H, int64_t H_kv, int64_t D, int64_t H_I,
                             int64_t D_I, DType dtype = DType::kFloat32) {
  std::mt19937_64 rng(seed);
  RefProjections p;
  p.B = B, p.T = T, p.S = S, p.H = H, p.H_kv = H_kv, p.D = D;
  p.H_I = H_I, p.D_I = D_I;
  const auto make = [&](int64_t n, double scale) {
    std::vector<double> v = Random(rng, n, scale);
    for (double& x : v) {
      x = dtype == DType::kBFloat16 ? klref::RoundToBFloat16(x)
          : dtype == DType::kFloat16
              ? klref::RoundToFloat16(x)
              : static_cast<double>(static_cast<float>(x));
    }
    return v;
  };
  p.query = make(B * T * H * D, 1.0);
  p.key = make(B * S * H_kv * D, 1.0);
  p.index_query = make(B * T * H_I * D_I, 1.0);
  p.index_key = make(B * S * D_I, 1.0);
  p.index_weights = make(B * T * H_I, 1.0);
  p.options.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
  return p;
}

// The library's inputs for a reference problem, and its outputs.
struct LibraryRun {
  absl::Status status;
  IndexerKlResult result;
  std::vector<double> d_index_query, d_index_key, d_index_weights;
  std::vector<int32_t> topk_indices;
  std::vector<double> row_kl;
  std::vector<std::byte> raw_dq, raw_dk, raw_dw;  // as written
};

struct Extras {
  DType dtype = DType::kFloat32;
  DType grad_dtype = DType::kFloat32;
  int64_t topk = 0;                       // the service selects
  std::optional<std::vector<float>> lse;  // [B,H,T]
  std::optional<std::vector<int32_t>> key_start, key_end;
  int threads = 2;
  // Computes the query rows in blocks of these sizes (cycled), as a stream
  // does, rather than all at once.
  std::vector<int64_t> blocks;
  // The CPU kernels' variant; the suite's (--isa) when absent.
  std::optional<cpu::Isa> isa;
  // Breaks the inputs after encoding: (tensor name, flat index, value).
  std::optional<std::pair<std::string, std::pair<int64_t, float>>> poke;
  // Asked between the steps of each tile (unary only).
  StopCheck stop;
  // Changes the outputs before the computation.
  std::function<void(ProjectionsOutputs&)> edit_outputs;
};

// The block of rows `rows` of a whole query-side tensor, in a stream
// block's layout ([n, ...]; lse [H, n]).
std::vector<std::byte> BlockOf(const TensorView& whole, RowRange rows,
                               int64_t T, int64_t heads_first) {
  const int64_t size = DTypeSize(whole.dtype);
  const auto* data = static_cast<const std::byte*>(whole.data);
  std::vector<std::byte> block;
  if (heads_first == 0) {
    const int64_t width = whole.byte_size / size / (whole.shape[0] * T);
    block.assign(data + rows.begin * width * size,
                 data + rows.end * width * size);
    return block;
  }
  for (int64_t h = 0; h < heads_first; ++h) {  // lse [B, H, T]
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const std::byte* at =
          data + ((r / T * heads_first + h) * T + r % T) * size;
      block.insert(block.end(), at, at + size);
    }
  }
  return block;
}

// The rows in blocks through a ProjectionsComputation, as the stream feeds
// it: each block's bytes copied out and freed after its call, outputs taken
// from the rows each call completes.
absl::StatusOr<IndexerKlResult> ComputeInBlocks(
    Backend& backend, const ProjectionsProblem& p, const ProjectionsInputs& in,
    const std::vector<int64_t>& sizes, const ProjectionsOutputs& out) {
  absl::StatusOr<ProjectionsComputation> computation =
      ProjectionsComputation::Create(backend, p);
  if (!computation.ok()) return computation.status();
  if (computation->needs_counting()) {
    if (!computation->counts_without_rows()) {
      absl::StatusOr<ProjectionsRowData> all = WholeProjectionsRows(p, in);
      if (!all.ok()) return all.status();
      if (absl::Status s = computation->Count(*all); !s.ok()) return s;
    } else if (absl::Status s = computation->Count({}); !s.ok()) {
      return s;
    }
  }
  const int64_t grad = DTypeSize(p.logits.options.grad_dtype);
  size_t next = 0;
  for (int64_t r = 0; r < p.num_rows();) {
    const RowRange rows{
        r, std::min(p.num_rows(), r + sizes[next++ % sizes.size()])};
    std::vector<std::byte> q = BlockOf(in.query, rows, p.T, 0);
    std::vector<std::byte> qi = BlockOf(in.index_query, rows, p.T, 0);
    std::vector<std::byte> w = BlockOf(in.index_weights, rows, p.T, 0);
    std::vector<std::byte> lse, idx;
    if (in.lse) lse = BlockOf(*in.lse, rows, p.T, p.H);
    if (in.topk_indices) idx = BlockOf(*in.topk_indices, rows, p.T, 0);
    ProjectionsBlockBytes bytes{
        .query = q.data(),
        .query_bytes = static_cast<int64_t>(q.size()),
        .index_query = qi.data(),
        .index_query_bytes = static_cast<int64_t>(qi.size()),
        .index_weights = w.data(),
        .index_weights_bytes = static_cast<int64_t>(w.size()),
        .lse = lse.data(),
        .lse_bytes = static_cast<int64_t>(lse.size()),
        .topk_indices = idx.data(),
        .topk_indices_bytes = static_cast<int64_t>(idx.size())};
    absl::StatusOr<ProjectionsRowData> data =
        BlockProjectionsRows(p, rows, bytes);
    if (!data.ok()) return data.status();
    // Outputs from the first row the call may complete: the held ones.
    const int64_t first = rows.begin - computation->held_rows();
    const ProjectionsBlockOutputs block_out{
        .d_index_query = out.rows.d_index_query + first * p.H_I * p.D_I * grad,
        .d_index_weights = out.rows.d_index_weights + first * p.H_I * grad,
        .topk_indices = out.rows.topk_indices == nullptr
                            ? nullptr
                            : out.rows.topk_indices + first * p.K,
        .row_kl = out.rows.row_kl + first,
        .capacity_rows = p.num_rows() - first};
    absl::StatusOr<RowRange> done =
        computation->Compute(rows, *data, block_out);
    if (!done.ok()) return done.status();
    if (done->size() > 0 && done->begin != first) {
      return absl::InternalError(
          "completed rows do not start at the held ones");
    }
    r = rows.end;
  }
  return computation->Finish(out.d_index_key);
}

LibraryRun RunLibrary(const RefProjections& ref, const Extras& x = {}) {
  const klref::RefProblem& o = ref.options;
  std::vector<std::vector<std::byte>> buffers;
  const auto add = [&](DType dtype, std::vector<int64_t> shape,
                       const std::vector<double>& values) {
    HostTensor t(dtype, shape);
    t.values = values;
    buffers.push_back(EncodeTensor(t));
    TensorView view;
    view.dtype = dtype;
    view.shape.assign(shape.begin(), shape.end());
    view.data = buffers.back().data();
    view.byte_size = static_cast<int64_t>(buffers.back().size());
    return view;
  };
  const auto as_doubles = [](const auto& v) {
    return std::vector<double>(v.begin(), v.end());
  };
  buffers.reserve(16);
  ProjectionsInputs in;
  in.query = add(x.dtype, {ref.B, ref.T, ref.H, ref.D}, ref.query);
  in.key = add(x.dtype, {ref.B, ref.S, ref.H_kv, ref.D}, ref.key);
  in.index_query =
      add(x.dtype, {ref.B, ref.T, ref.H_I, ref.D_I}, ref.index_query);
  in.index_key = add(x.dtype, {ref.B, ref.S, ref.D_I}, ref.index_key);
  in.index_weights = add(x.dtype, {ref.B, ref.T, ref.H_I}, ref.index_weights);
  if (x.lse) {
    in.lse = add(DType::kFloat32, {ref.B, ref.H, ref.T}, as_doubles(*x.lse));
  }
  if (ref.K > 0) {
    in.topk_indices =
        add(DType::kInt32, {ref.B, ref.T, ref.K}, as_doubles(ref.topk_indices));
  }
  if (!o.segment_ids_q.empty()) {
    in.segment_ids_q =
        add(DType::kInt32, {ref.B, ref.T}, as_doubles(o.segment_ids_q));
    in.segment_ids_kv =
        add(DType::kInt32, {ref.B, ref.S}, as_doubles(o.segment_ids_kv));
  }
  if (!o.attention_mask.empty()) {
    in.attention_mask =
        add(DType::kBool, {ref.B, ref.T, ref.S}, as_doubles(o.attention_mask));
  }
  if (!o.key_padding_mask.empty()) {
    in.key_padding_mask =
        add(DType::kBool, {ref.B, ref.S}, as_doubles(o.key_padding_mask));
  }
  if (!o.row_valid.empty()) {
    in.row_valid = add(DType::kBool, {ref.B, ref.T}, as_doubles(o.row_valid));
  }
  if (x.key_start) {
    in.key_start = add(DType::kInt32, {ref.B, ref.T}, as_doubles(*x.key_start));
    in.key_end = add(DType::kInt32, {ref.B, ref.T}, as_doubles(*x.key_end));
  }
  if (x.poke) {
    const TensorView* views[] = {&in.query, &in.key, &in.index_query,
                                 &in.index_key, &in.index_weights};
    const char* names[] = {"query", "key", "index_query", "index_key",
                           "index_weights"};
    for (int i = 0; i < 5; ++i) {
      if (x.poke->first != names[i]) continue;
      auto* data = static_cast<std::byte*>(const_cast<void*>(views[i]->data));
      std::memcpy(data + 4 * x.poke->second.first, &x.poke->second.second, 4);
    }
  }

  ProjectionsOptions options;
  IndexerKlOptions& loss = options.loss;
  loss.causal = o.causal;
  loss.q_offset = o.q_offset;
  loss.softmax_scale = static_cast<float>(o.softmax_scale);
  loss.flavor =
      o.flavor == RefFlavor::kMaxText ? Flavor::kMaxText : Flavor::kExact;
  loss.reduction = o.reduction == RefReduction::kMean  ? Reduction::kMean
                   : o.reduction == RefReduction::kSum ? Reduction::kSum
                                                       : Reduction::kMeanValid;
  loss.scaling_factor = o.scaling_factor;
  loss.grad_scale = o.grad_scale;
  loss.grad_dtype = x.grad_dtype;
  loss.want_row_kl = true;
  options.index_weight_scale = ref.index_weight_scale;
  options.use_relu = ref.use_relu;
  options.topk = x.topk;

  LibraryRun run;
  absl::StatusOr<ProjectionsProblem> problem =
      ProjectionsProblem::Create(in, options);
  if (!problem.ok()) {
    run.status = problem.status();
    return run;
  }
  const int64_t size = DTypeSize(x.grad_dtype);
  run.raw_dq.resize(ref.B * ref.T * ref.H_I * ref.D_I * size);
  run.raw_dk.resize(ref.B * ref.S * ref.D_I * size);
  run.raw_dw.resize(ref.B * ref.T * ref.H_I * size);
  run.topk_indices.assign(ref.B * ref.T * std::max<int64_t>(x.topk, 1), -7);
  run.row_kl.assign(ref.B * ref.T, NAN);
  ProjectionsOutputs out{.rows = {.d_index_query = run.raw_dq.data(),
                                  .d_index_weights = run.raw_dw.data(),
                                  .topk_indices = run.topk_indices.data(),
                                  .row_kl = run.row_kl.data(),
                                  .capacity_rows = ref.B * ref.T},
                         .d_index_key = run.raw_dk.data()};
  if (x.edit_outputs) x.edit_outputs(out);
  CpuBackend backend(x.threads, x.isa.value_or(testdata::TestIsa()));
  absl::StatusOr<IndexerKlResult> result;
  if (absl::StatusOr<ProjectionsRowData> rows =
          WholeProjectionsRows(*problem, in);
      !rows.ok()) {
    result = rows.status();
  } else if (x.blocks.empty()) {
    result = ComputeProjectionsLoss(backend, *problem, *rows, out, x.stop);
  } else {
    result = ComputeInBlocks(backend, *problem, in, x.blocks, out);
  }
  if (!result.ok()) {
    run.status = result.status();
    return run;
  }
  run.result = *result;
  run.d_index_query = DecodeFloats(run.raw_dq.data(), x.grad_dtype,
                                   ref.B * ref.T * ref.H_I * ref.D_I);
  run.d_index_key =
      DecodeFloats(run.raw_dk.data(), x.grad_dtype, ref.B * ref.S * ref.D_I);
  run.d_index_weights =
      DecodeFloats(run.raw_dw.data(), x.grad_dtype, ref.B * ref.T * ref.H_I);
  return run;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

void ExpectClose(const std::vector<double>& got,
                 const std::vector<double>& want, double tolerance,
                 const char* name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  const double scale = std::max(MaxAbs(want), 1e-30);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * scale) << name << "[" << i << "]";
  }
}

// The library's answer against the reference's, with tolerances for float32
// arithmetic (or for gradients rounded to a 16-bit dtype).
void ExpectMatchesReference(const RefProjections& ref, const Extras& x = {},
                            double grad_tolerance = 2e-4) {
  const LibraryRun run = RunLibrary(ref, x);
  ASSERT_TRUE(run.status.ok()) << run.status;
  RefProjections with_selection = ref;
  if (x.topk > 0) with_selection.K = x.topk;
  const klref::RefProjectionsResult want =
      klref::ComputeProjectionsReference(with_selection);
  ASSERT_TRUE(want.kl.error.empty()) << want.kl.error;
  EXPECT_NEAR(run.result.loss, want.kl.loss,
              1e-5 * (1 + std::abs(want.kl.loss)));
  EXPECT_NEAR(run.result.unscaled_loss, want.kl.unscaled_loss,
              1e-5 * (1 + std::abs(want.kl.unscaled_loss)));
  EXPECT_EQ(run.result.denominator, want.kl.denominator);
  EXPECT_EQ(run.result.rows_counted, want.kl.rows_counted);
  EXPECT_EQ(run.result.rows_fully_masked, want.kl.rows_fully_masked);
  for (size_t r = 0; r < want.kl.row_kl.size(); ++r) {
    ASSERT_NEAR(run.row_kl[r], want.kl.row_kl[r],
                1e-5 * (1 + std::abs(want.kl.row_kl[r])))
        << "row_kl[" << r << "]";
  }
  ExpectClose(run.d_index_query, want.d_index_query, grad_tolerance,
              "d_index_query");
  ExpectClose(run.d_index_key, want.d_index_key, grad_tolerance, "d_index_key");
  ExpectClose(run.d_index_weights, want.d_index_weights, grad_tolerance,
              "d_index_weights");
  if (x.topk > 0) {
    ASSERT_EQ(run.topk_indices.size(), want.topk_indices.size());
    for (size_t i = 0; i < want.topk_indices.size(); ++i) {
      ASSERT_EQ(run.topk_indices[i], want.topk_indices[i])
          << "topk[" << i << "]";
    }
  }
}

// Each head's lse over each row's valid keys, in float64, from the
// reference's own logits form (the logits it computes from the projections).
std::vector<float> ExactLse(const RefProjections& ref) {
  const klref::RefProblem logits = klref::LogitsFormOf(ref, ref.topk_indices);
  const klref::RefResult kl = klref::ComputeReference(logits);
  const int64_t L = logits.slots();
  std::vector<float> lse(ref.B * ref.H * ref.T, INFINITY);
  for (int64_t b = 0; b < ref.B; ++b) {
    for (int64_t h = 0; h < ref.H; ++h) {
      for (int64_t t = 0; t < ref.T; ++t) {
        double m = -INFINITY;
        const double* a = &logits.logits[((b * ref.H + h) * ref.T + t) * L];
        const uint8_t* valid = &kl.valid[(b * ref.T + t) * L];
        for (int64_t s = 0; s < L; ++s) {
          if (valid[s]) m = std::max(m, logits.softmax_scale * a[s]);
        }
        if (m == -INFINITY) continue;
        double sum = 0;
        for (int64_t s = 0; s < L; ++s) {
          if (valid[s]) sum += std::exp(logits.softmax_scale * a[s] - m);
        }
        lse[(b * ref.H + h) * ref.T + t] =
            static_cast<float>(m + std::log(sum));
      }
    }
  }
  return lse;
}

TEST(ProjectionsTest, DenseCausalMhaMatchesTheReference) {
  RefProjections p = RandomProblem(1, 2, 7, 7, 3, 3, 8, 2, 4);
  p.options.causal = true;
  ExpectMatchesReference(p);
}

TEST(ProjectionsTest, GqaAndMqaMatchTheReference) {
  for (int64_t H_kv : {2, 1}) {
    RefProjections p = RandomProblem(2 + H_kv, 1, 6, 9, 4, H_kv, 8, 3, 4);
    p.options.causal = true;
    SCOPED_TRACE(H_kv);
    ExpectMatchesReference(p);
  }
}

TEST(ProjectionsTest, FlavoursReductionsAndScalesMatchTheReference) {
  for (RefFlavor flavor : {RefFlavor::kExact, RefFlavor::kMaxText}) {
    for (RefReduction reduction :
         {RefReduction::kMean, RefReduction::kMeanValid, RefReduction::kSum}) {
      RefProjections p = RandomProblem(5, 2, 5, 6, 2, 1, 4, 2, 3);
      p.options.flavor = flavor;
      p.options.reduction = reduction;
      p.options.scaling_factor = 0.01;
      p.options.grad_scale = 3.5;
      p.options.causal = true;
      p.options.q_offset = 0;  // MaxText's alignment: some rows see 1 key
      p.options.key_padding_mask = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0};
      SCOPED_TRACE(static_cast<int>(flavor) * 10 + static_cast<int>(reduction));
      ExpectMatchesReference(p);
    }
  }
}

TEST(ProjectionsTest, ReluOffAndWeightScaleMatchTheReference) {
  RefProjections p = RandomProblem(7, 1, 5, 5, 2, 2, 4, 3, 4);
  p.use_relu = false;
  p.index_weight_scale = 0.8;
  ExpectMatchesReference(p);
}

TEST(ProjectionsTest, CausalWithFewerQueriesThanKeys) {
  RefProjections p = RandomProblem(8, 2, 4, 9, 2, 1, 4, 2, 4);
  p.options.causal = true;  // q_offset = S - T: the last query sees all keys
  ExpectMatchesReference(p);
  p.options.q_offset = 0;
  ExpectMatchesReference(p);
}

TEST(ProjectionsTest, MasksRowValidAndFullyMaskedRows) {
  RefProjections p = RandomProblem(9, 2, 4, 5, 2, 1, 4, 2, 3);
  p.options.segment_ids_q = {0, 0, 1, 1, 0, 1, 1, 2};
  p.options.segment_ids_kv = {0, 0, 1, 1, 1, 0, 1, 1, -1, -1};
  p.options.row_valid = {1, 1, 0, 1, 1, 1, 1, 0};
  p.options.causal = true;
  for (RefReduction reduction :
       {RefReduction::kMean, RefReduction::kMeanValid}) {
    p.options.reduction = reduction;
    ExpectMatchesReference(p);
  }
  // Without row_valid, MEAN_VALID counts the rows with a valid key (the
  // (b=1, t=3) row, segment 2, has none).
  p.options.row_valid.clear();
  p.options.reduction = RefReduction::kMeanValid;
  ExpectMatchesReference(p);
}

// MEAN_VALID's N without row_valid, where only the causal cut and the key
// padding decide which rows have a key, comes in closed form (a stream's
// header may declare any T, with no bytes behind it): it must be the
// reference's count for every q_offset and padding, a batch entry without
// any key included, dense and with the service's top-k.
TEST(ProjectionsTest, RowsWithKeysFromTheCausalCutAndPaddingAlone) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 12; ++trial) {
    RefProjections p = RandomProblem(40 + trial, 3, 9, 7, 2, 1, 4, 2, 4);
    p.options.reduction = RefReduction::kMeanValid;
    p.options.causal = trial % 4 != 3;
    p.options.q_offset = static_cast<int64_t>(rng() % 20) - 12;
    p.options.key_padding_mask.resize(3 * 7);
    for (uint8_t& v : p.options.key_padding_mask) v = rng() % 3 != 0;
    if (trial % 2 == 0) {
      std::fill_n(p.options.key_padding_mask.begin() + 7, 7, 0);
    }
    SCOPED_TRACE(
        absl::StrCat("trial ", trial, " q_offset ", *p.options.q_offset));
    ExpectMatchesReference(p);
    Extras topk;
    topk.topk = 3;
    ExpectMatchesReference(p, topk);
  }
}

// Where the rows' keys need their own tensors (segment ids here), the count
// walks the rows in chunks, asking the stop check before each.
TEST(ProjectionsTest, StopCheckEndsTheCountOfRows) {
  RefProjections p = RandomProblem(23, 2, 4, 5, 1, 1, 4, 1, 4);
  p.options.segment_ids_q = {0, 0, 1, 1, 0, 1, 1, 1};
  p.options.segment_ids_kv = {0, 0, 1, 1, 1, 0, 1, 1, -1, -1};
  p.options.reduction = RefReduction::kMeanValid;
  Extras x;
  x.threads = 1;
  int asked = 0;
  x.stop = [&asked]() {
    ++asked;
    return absl::DeadlineExceededError("out of time");
  };
  const LibraryRun stopped = RunLibrary(p, x);
  EXPECT_EQ(stopped.status, absl::DeadlineExceededError("out of time"));
  EXPECT_EQ(asked, 1);
}

TEST(ProjectionsTest, TilesWithoutAnyValidKeyGiveZeros) {
  // Causal with q_offset = -200: rows t < 200 see no key, so the first
  // tile has none at all; the second tile's rows see some.
  RefProjections p = RandomProblem(24, 1, 260, 70, 2, 1, 4, 2, 4);
  p.options.causal = true;
  p.options.q_offset = -200;
  for (RefReduction reduction :
       {RefReduction::kMean, RefReduction::kMeanValid}) {
    p.options.reduction = reduction;
    ExpectMatchesReference(p);
    Extras topk;
    topk.topk = 3;
    ExpectMatchesReference(p, topk);
  }
  p.options.q_offset = -1000;  // no key anywhere: N = 0 under MEAN_VALID
  ExpectMatchesReference(p);
}

TEST(ProjectionsTest, GivenLseMatchesTheReference) {
  RefProjections p = RandomProblem(10, 2, 5, 6, 3, 3, 4, 2, 4);
  p.options.causal = true;
  Extras x;
  x.lse = ExactLse(p);
  ExpectMatchesReference(p, x);
  p.options.flavor = RefFlavor::kMaxText;
  ExpectMatchesReference(p, x);
}

TEST(ProjectionsTest, WrongLseIsRefusedNamingRowAndHead) {
  RefProjections p = RandomProblem(11, 1, 3, 4, 2, 2, 4, 2, 4);
  Extras x;
  x.lse = ExactLse(p);
  (*x.lse)[1 * p.T + 2] += 0.01f;  // head 1, row t = 2: mass e^-0.01
  const LibraryRun run = RunLibrary(p, x);
  EXPECT_TRUE(absl::IsInvalidArgument(run.status));
  EXPECT_NE(run.status.message().find("lse: head 1 of row (b=0, t=2)"),
            std::string::npos)
      << run.status;
}

// An lse far below one valid logit and equal to another: the head's mass is
// 1 + e^x with x past 88, where the kernels' exp is not defined, and must
// fail the mass check, not come out as 1 plus some small number.
TEST(ProjectionsTest, LseFarBelowALogitIsRefused) {
  // Row t = 1 sees keys 0 and 1 (causal, T = S): logits 0 and x.
  RefProjections p = RandomProblem(14, 1, 2, 2, 1, 1, 1, 1, 1);
  p.options.causal = true;
  p.options.softmax_scale = 1.0;
  for (bool sparse : {false, true}) {
    if (sparse) {  // the client's indices: both keys where they are valid
      p.K = 2;
      p.topk_indices = {0, -1, 0, 1};
    }
    for (double x : {89.5, 100.0, 120.0, 150.0, 177.0, 400.0}) {
      SCOPED_TRACE(::testing::Message()
                   << (sparse ? "sparse" : "dense") << ", logit " << x);
      p.query = {1.0, 1.0};
      p.key = {0.0, x};
      Extras extras;
      extras.lse = ExactLse(p);
      (*extras.lse)[1] = 0.0f;  // row t = 1: key 0's logit
      const LibraryRun run = RunLibrary(p, extras);
      EXPECT_TRUE(absl::IsInvalidArgument(run.status)) << run.status;
      EXPECT_NE(run.status.message().find("lse: head 0 of row (b=0, t=1)"),
                std::string::npos)
          << run.status;
    }
  }
}

// A key whose logit lies 88 to 93 below its head's maximum has p of e^-88
// to e^-93, subnormal floats, which the kernels' exp flushed to 0; against
// an indexer score 1e38 below the other key's, its KL term of about 4e-3 to
// 0.6 nats was lost. (Past 93 the gradients, which scale with p, keep too
// few bits for this test's tolerance: 15 at e^-93.) Row t = 1 sees keys 0 and 1
// (causal, T = S): logits 0 and -x, scores 0 and -1e38; dense and sparse, with
// and without an lse.
TEST(ProjectionsTest, SubnormalTargetMassKeepsItsTerm) {
  RefProjections p = RandomProblem(15, 1, 2, 2, 1, 1, 1, 1, 1);
  p.options.causal = true;
  p.options.softmax_scale = 1.0;
  p.query = {1.0, 1.0};
  p.index_query = {1.0, 1.0};
  p.index_key = {0.0, 1e19};
  p.index_weights = {-1e19, -1e19};
  for (bool sparse : {false, true}) {
    if (sparse) {  // the client's indices: both keys where they are valid
      p.K = 2;
      p.topk_indices = {0, -1, 0, 1};
    }
    for (double x : {88.0, 90.0, 93.0}) {
      p.key = {0.0, -x};
      for (bool lse : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (sparse ? "sparse" : "dense") << ", logit " << -x
                     << (lse ? ", lse" : ""));
        Extras extras;
        if (lse) extras.lse = ExactLse(p);
        ExpectMatchesReference(p, extras);
        const klref::RefProjectionsResult want =
            klref::ComputeProjectionsReference(p);
        EXPECT_GT(want.kl.unscaled_loss, 1e-3);
      }
    }
  }
}

TEST(ProjectionsTest, SparseWithClientIndicesMatchesTheReference) {
  RefProjections p = RandomProblem(12, 2, 5, 8, 4, 2, 4, 2, 4);
  p.K = 3;
  std::mt19937_64 rng(3);
  for (int64_t r = 0; r < p.B * p.T; ++r) {
    std::vector<int64_t> keys = {0, 1, 2, 3, 4, 5, 6, 7};
    std::shuffle(keys.begin(), keys.end(), rng);
    for (int64_t j = 0; j < p.K; ++j) p.topk_indices.push_back(keys[j]);
  }
  p.topk_indices[4] = -1;  // empty slots: -1, or any index outside [0, S)
  p.topk_indices[7] = 8;
  p.topk_indices[8] = -5;
  p.topk_indices[12] = 8;
  p.topk_indices[13] = 8;
  p.options.causal = true;
  ExpectMatchesReference(p);
  Extras x;
  x.lse = ExactLse(p);
  ExpectMatchesReference(p, x);
}

// The loss within 1e-6 (1 + |loss|): a KL near 0 is a difference of terms
// near log S, which float32 rounds to about 1e-7 absolute. The gradients
// within 1e-5 of their largest magnitude.
void ExpectCloseToTheReference(const RefProjections& p, const Extras& x = {}) {
  const LibraryRun run = RunLibrary(p, x);
  ASSERT_TRUE(run.status.ok()) << run.status;
  const klref::RefProjectionsResult want =
      klref::ComputeProjectionsReference(p);
  ASSERT_TRUE(want.kl.error.empty()) << want.kl.error;
  EXPECT_NEAR(run.result.loss, want.kl.loss,
              1e-6 * (1 + std::abs(want.kl.loss)));
  ExpectClose(run.d_index_query, want.d_index_query, 1e-5, "d_index_query");
  ExpectClose(run.d_index_key, want.d_index_key, 1e-5, "d_index_key");
  ExpectClose(run.d_index_weights, want.d_index_weights, 1e-5,
              "d_index_weights");
}

// One float32 sum of every head's softmax stagnated (the loss was off by
// about 1e-3 of itself at 2^20 heads); the tiles sum the heads in blocks of
// kHeadsPerFloatSum, dense and sparse alike. Around the block size a head
// dropped or counted twice is an error of about 1%; at 2^18 heads the old
// sum's loss was off by a few 1e-6.
TEST(ProjectionsTest, ManyHeadsAreSummedWithoutStagnating) {
  for (const int64_t H :
       std::initializer_list<int64_t>{64, 65, 128, 129, 1 << 18}) {
    SCOPED_TRACE(H);
    // Two key tiles of 512, unless the heads are many.
    const int64_t S = H < 1024 ? 600 : 6;
    RefProjections p = RandomProblem(14, 1, 3, S, H, 1, 2, 2, 4);
    p.options.causal = true;
    ExpectCloseToTheReference(p);  // the logits kept for pass 2
    Extras with_lse;
    with_lse.lse = ExactLse(p);  // the logits computed again
    ExpectCloseToTheReference(p, with_lse);
    p.K = 3;
    p.topk_indices = {0, -1, -1, 0, 1, -1, S - 1, 2, 4};
    ExpectCloseToTheReference(p);
  }
}

TEST(ProjectionsTest, ServerTopkMatchesTheReferenceAndBreaksTiesLow) {
  RefProjections p = RandomProblem(13, 2, 6, 10, 2, 1, 4, 2, 4);
  // Keys 3 and 7 of batch 0 are equal: every row scores them alike.
  for (int64_t d = 0; d < p.D_I; ++d) {
    p.index_key[7 * p.D_I + d] = p.index_key[3 * p.D_I + d];
  }
  p.options.causal = true;
  Extras x;
  x.topk = 4;
  ExpectMatchesReference(p, x);
  // Selection by the service equals sending the same indices.
  const LibraryRun selected = RunLibrary(p, x);
  RefProjections sent = p;
  sent.K = x.topk;
  sent.topk_indices.assign(selected.topk_indices.begin(),
                           selected.topk_indices.end());
  const LibraryRun given = RunLibrary(sent);
  ASSERT_TRUE(given.status.ok()) << given.status;
  EXPECT_EQ(given.raw_dq, selected.raw_dq);
  EXPECT_EQ(given.raw_dk, selected.raw_dk);
  EXPECT_EQ(given.result.loss, selected.result.loss);
}

TEST(ProjectionsTest, SixteenBitInputsAndGradients) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    RefProjections p = RandomProblem(14, 1, 6, 6, 2, 1, 8, 2, 4, dtype);
    p.options.causal = true;
    Extras x;
    x.dtype = dtype;
    ExpectMatchesReference(p, x);
    x.grad_dtype = dtype;
    ExpectMatchesReference(p, x, dtype == DType::kBFloat16 ? 1e-2 : 2e-3);
  }
}

TEST(ProjectionsTest, KeyBoundsEqualTheirExplicitMask) {
  // THD: one sequence of three documents [0,3), [3,7), [7,10), causal
  // within each, as key bounds; against the same mask sent explicitly.
  RefProjections p = RandomProblem(15, 1, 10, 10, 2, 1, 4, 2, 4);
  Extras x;
  x.key_start.emplace();
  x.key_end.emplace();
  p.options.attention_mask.assign(10 * 10, 0);
  for (int32_t t = 0; t < 10; ++t) {
    const int32_t start = t < 3 ? 0 : t < 7 ? 3 : 7;
    x.key_start->push_back(start);
    x.key_end->push_back(t + 1);
    for (int32_t s = start; s <= t; ++s)
      p.options.attention_mask[t * 10 + s] = 1;
  }
  ExpectMatchesReference(p);  // the explicit mask
  RefProjections bounded = p;
  bounded.options.attention_mask.clear();
  const LibraryRun with_bounds = RunLibrary(bounded, x);
  const LibraryRun with_mask = RunLibrary(p);
  ASSERT_TRUE(with_bounds.status.ok()) << with_bounds.status;
  EXPECT_NEAR(with_bounds.result.loss, with_mask.result.loss, 1e-12);
  ExpectClose(with_bounds.d_index_query, with_mask.d_index_query, 1e-6,
              "d_index_query");
  ExpectClose(with_bounds.d_index_key, with_mask.d_index_key, 1e-6,
              "d_index_key");
}

TEST(ProjectionsTest, ManyTilesMatchTheReferenceAndThreadCountsAgreeBitwise) {
  // T and S span several row tiles and key tiles.
  RefProjections p = RandomProblem(16, 2, 150, 300, 2, 1, 8, 2, 8);
  p.options.causal = true;
  ExpectMatchesReference(p);
  LibraryRun runs[3];
  for (int threads : {1, 2, 3}) {
    Extras x;
    x.threads = threads;
    runs[threads - 1] = RunLibrary(p, x);
    ASSERT_TRUE(runs[threads - 1].status.ok());
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(runs[i].raw_dq, runs[0].raw_dq);
    EXPECT_EQ(runs[i].raw_dk, runs[0].raw_dk);
    EXPECT_EQ(runs[i].raw_dw, runs[0].raw_dw);
    EXPECT_EQ(runs[i].result.loss, runs[0].result.loss);
  }
}

TEST(ProjectionsTest, SparseManyRowsThreadCountsAgreeBitwise) {
  RefProjections p = RandomProblem(17, 1, 40, 50, 2, 2, 4, 2, 4);
  p.options.causal = true;
  LibraryRun runs[2];
  for (int threads : {1, 3}) {
    Extras x;
    x.topk = 8;
    x.threads = threads;
    runs[threads / 2] = RunLibrary(p, x);
    ASSERT_TRUE(runs[threads / 2].status.ok());
  }
  EXPECT_EQ(runs[0].raw_dk, runs[1].raw_dk);
  EXPECT_EQ(runs[0].raw_dq, runs[1].raw_dq);
  Extras x;
  x.topk = 8;
  ExpectMatchesReference(p, x);
}

TEST(ProjectionsTest, LogitsTooLargeToKeepAreRecomputed) {
  // The first tile's main logits (128 rows x 16 heads x 6656 keys) and
  // indexer dot products (x 8 heads) pass the most a tile keeps between its
  // passes; the second tile's (2 rows) do not: both paths, against the
  // reference.
  RefProjections p = RandomProblem(21, 1, 130, 6200, 16, 1, 4, 8, 4);
  ExpectMatchesReference(p);
}

// Blocks of any size, in any case, give the unary call's bits.
void ExpectBlocksGiveUnaryBits(const RefProjections& p, Extras x) {
  const LibraryRun whole = RunLibrary(p, x);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  for (const std::vector<int64_t>& sizes :
       std::vector<std::vector<int64_t>>{{1}, {7, 130, 3}, {200}, {64, 65}}) {
    x.blocks = sizes;
    const LibraryRun blocks = RunLibrary(p, x);
    ASSERT_TRUE(blocks.status.ok()) << blocks.status;
    EXPECT_EQ(blocks.raw_dq, whole.raw_dq);
    EXPECT_EQ(blocks.raw_dk, whole.raw_dk);
    EXPECT_EQ(blocks.raw_dw, whole.raw_dw);
    EXPECT_EQ(blocks.topk_indices, whole.topk_indices);
    EXPECT_EQ(blocks.result.loss, whole.result.loss);
    for (size_t r = 0; r < whole.row_kl.size(); ++r) {
      ASSERT_EQ(blocks.row_kl[r], whole.row_kl[r]) << r;
    }
  }
}

TEST(ProjectionsTest, RowsInBlocksGiveTheUnaryBits) {
  RefProjections p = RandomProblem(22, 2, 150, 160, 2, 1, 4, 2, 4);
  p.options.causal = true;
  ExpectBlocksGiveUnaryBits(p, {});
  Extras x;
  x.lse = ExactLse(p);
  ExpectBlocksGiveUnaryBits(p, x);
  p.options.reduction = RefReduction::kMeanValid;  // N counted first
  p.options.q_offset = -5;                         // rows without a key
  ExpectBlocksGiveUnaryBits(p, {});
  Extras topk;
  topk.topk = 5;
  ExpectBlocksGiveUnaryBits(p, topk);
  RefProjections sparse = p;
  sparse.K = 3;
  std::mt19937_64 rng(4);
  for (int64_t r = 0; r < p.B * p.T; ++r) {
    for (int64_t j = 0; j < sparse.K; ++j) {
      sparse.topk_indices.push_back(j == 2 ? -1 : (r % p.T + j) % p.S);
    }
  }
  ExpectBlocksGiveUnaryBits(sparse, {});
  // Batch entries shorter than a tile: the held rows' room, and lse's head
  // stride in it, is T rows.
  RefProjections short_entries = RandomProblem(24, 2, 10, 12, 2, 1, 4, 2, 4);
  short_entries.options.causal = true;
  Extras short_lse;
  short_lse.lse = ExactLse(short_entries);
  ExpectBlocksGiveUnaryBits(short_entries, short_lse);
}

TEST(ProjectionsTest, EveryIsaVariantGivesTheSameBits) {
  RefProjections p = RandomProblem(23, 2, 140, 150, 4, 2, 8, 2, 8);
  p.options.causal = true;
  p.options.flavor = RefFlavor::kMaxText;
  for (int64_t topk : {0, 6}) {
    Extras x;
    x.topk = topk;
    x.isa = cpu::Isa::kBaseline;
    const LibraryRun baseline = RunLibrary(p, x);
    ASSERT_TRUE(baseline.status.ok()) << baseline.status;
    for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
      if (!cpu::CpuRuns(isa)) continue;
      x.isa = isa;
      const LibraryRun run = RunLibrary(p, x);
      ASSERT_TRUE(run.status.ok()) << run.status;
      EXPECT_EQ(run.raw_dq, baseline.raw_dq) << cpu::IsaName(isa);
      EXPECT_EQ(run.raw_dk, baseline.raw_dk) << cpu::IsaName(isa);
      EXPECT_EQ(run.raw_dw, baseline.raw_dw) << cpu::IsaName(isa);
      EXPECT_EQ(run.result.loss, baseline.result.loss) << cpu::IsaName(isa);
    }
  }
}

// ---------------------------------------------------------------------------
// Validation.

void ExpectInvalid(const RefProjections& p, const Extras& x,
                   const std::string& starts_with) {
  const LibraryRun run = RunLibrary(p, x);
  EXPECT_TRUE(absl::IsInvalidArgument(run.status)) << run.status;
  EXPECT_EQ(std::string(run.status.message()).substr(0, starts_with.size()),
            starts_with)
      << run.status;
}

TEST(ProjectionsTest, NonFiniteProjectionsAreRefusedWithTheirPosition) {
  const RefProjections p = RandomProblem(18, 1, 3, 4, 2, 1, 4, 2, 4);
  Extras x;
  x.poke = {"index_key", {5, NAN}};
  ExpectInvalid(p, x,
                "index_key: every value must be finite, got NaN or "
                "infinity at (b=0, s=1, d=1)");
  // [B, T, H, D] = [1, 3, 2, 4] and [B, T, H_I] = [1, 3, 2].
  x.poke = {"query", {13, INFINITY}};
  ExpectInvalid(p, x,
                "query: every value must be finite, got NaN or infinity at "
                "(b=0, t=1, h=1, d=1)");
  x.poke = {"index_query", {22, NAN}};
  ExpectInvalid(p, x,
                "index_query: every value must be finite, got NaN or infinity "
                "at (b=0, t=2, h=1, d=2)");
  x.poke = {"index_weights", {3, -INFINITY}};
  ExpectInvalid(p, x,
                "index_weights: every value must be finite, got NaN or "
                "infinity at (b=0, t=1, h=1)");
}

TEST(ProjectionsTest, ShapeAndOptionErrorsNameTheField) {
  RefProjections p = RandomProblem(19, 1, 3, 4, 3, 2, 4, 2, 4);
  ExpectInvalid(p, {}, "key: H_kv must divide");
  p = RandomProblem(19, 1, 3, 4, 2, 1, 4, 2, 4);
  Extras x;
  x.topk = -1;
  ExpectInvalid(p, x, "topk: must be >= 1");
  x.topk = 2;
  x.lse = ExactLse(p);
  ExpectInvalid(p, x, "lse: must not be given with topk");
  RefProjections sparse = p;
  sparse.K = 1;
  sparse.topk_indices = {0, 1, 2};
  x = {};
  x.topk = 2;
  ExpectInvalid(sparse, x, "topk: topk and topk_indices exclude each other");
  x = {};
  x.key_start = std::vector<int32_t>{0, 0, 0};
  x.key_end = std::vector<int32_t>{1, 5, 2};
  ExpectInvalid(p, x, "key_end: must be <= S = 4, got 5 at (b=0, t=1)");
}

// A library caller that leaves out an output the problem asks for, or gives
// buffers for fewer rows than the problem's, is told which.
TEST(ProjectionsTest, MissingOrShortOutputsAreRefusedNamingThem) {
  const RefProjections p = RandomProblem(23, 1, 3, 4, 2, 1, 4, 2, 4);
  const std::pair<const char*, std::function<void(ProjectionsOutputs&)>>
      cases[] = {
          {"d_index_query",
           [](ProjectionsOutputs& o) { o.rows.d_index_query = nullptr; }},
          {"d_index_weights",
           [](ProjectionsOutputs& o) { o.rows.d_index_weights = nullptr; }},
          {"topk_indices",
           [](ProjectionsOutputs& o) { o.rows.topk_indices = nullptr; }},
          {"row_kl", [](ProjectionsOutputs& o) { o.rows.row_kl = nullptr; }},
          {"d_index_key",
           [](ProjectionsOutputs& o) { o.d_index_key = nullptr; }},
          {"outputs: must hold 3 rows, got 2",
           [](ProjectionsOutputs& o) { o.rows.capacity_rows = 2; }},
      };
  for (const auto& [name, edit] : cases) {
    Extras x;
    x.topk = 2;
    x.edit_outputs = edit;
    const LibraryRun run = RunLibrary(p, x);
    EXPECT_EQ(run.status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(absl::StartsWith(run.status.message(), name))
        << name << ": " << run.status;
  }
  // Outputs the problem does not ask for need no buffer: without the
  // service's selection, topk_indices.
  Extras x;
  x.edit_outputs = [](ProjectionsOutputs& o) { o.rows.topk_indices = nullptr; };
  EXPECT_TRUE(RunLibrary(p, x).status.ok());
}

// Logits [B, H, T, S] (or K) too large to have a size are refused naming
// what the client sent (query, topk, topk_indices), not the logits-form
// tensors the service builds from them. Specs of the query side without
// bytes, as a stream's header carries them.
TEST(ProjectionsTest, ImpliedLogitsTooLargeNameTheClientsField) {
  constexpr int64_t kT = int64_t{1} << 45, kS = 1 << 20;
  const std::vector<float> key(kS, 1.0f);
  ProjectionsInputs in;
  in.query = {.dtype = DType::kFloat32, .shape = {1, kT, 1, 1}};
  in.key = {.dtype = DType::kFloat32,
            .shape = {1, kS, 1, 1},
            .data = key.data(),
            .byte_size = kS * 4};
  in.index_query = {.dtype = DType::kFloat32, .shape = {1, kT, 1, 1}};
  in.index_key = {.dtype = DType::kFloat32,
                  .shape = {1, kS, 1},
                  .data = key.data(),
                  .byte_size = kS * 4};
  in.index_weights = {.dtype = DType::kFloat32, .shape = {1, kT, 1}};
  ProjectionsOptions options;
  const auto expect = [&](const std::string& starts_with) {
    const absl::StatusOr<ProjectionsProblem> problem =
        ProjectionsProblem::Create(in, options);
    ASSERT_FALSE(problem.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(problem.status())) << problem.status();
    EXPECT_TRUE(absl::StartsWith(problem.status().message(), starts_with))
        << problem.status();
  };
  expect("query: the logits [B, H, T, S] it implies must have a byte size");
  // T * S fits; T * K does not.
  in.query.shape[1] = in.index_query.shape[1] = in.index_weights.shape[1] =
      int64_t{1} << 40;
  options.topk = int64_t{1} << 30;
  expect("topk: the logits [B, H, T, K] it implies");
  options.topk = 0;
  in.topk_indices = TensorView{.dtype = DType::kInt32,
                               .shape = {1, int64_t{1} << 40, 1 << 30}};
  expect("topk_indices:");
}

// A tensor of the wrong shape says where its expected shape came from: the
// client's query and key, not the logits form's indexer_scores or num_keys,
// which this form never sends (found by an adversarial helper).
TEST(ProjectionsTest, AWrongShapeNamesTheQueryOrKeyItFollows) {
  // The key side comes whole (a stream's header too); the rest as specs.
  const std::vector<float> keys(2 * 7 * 4, 1.0f);
  ProjectionsInputs in;
  in.query = {.dtype = DType::kFloat32, .shape = {2, 5, 2, 4}};
  in.key = {.dtype = DType::kFloat32,
            .shape = {2, 7, 1, 4},
            .data = keys.data(),
            .byte_size = 2 * 7 * 4 * 4};
  in.index_query = {.dtype = DType::kFloat32, .shape = {2, 5, 2, 4}};
  in.index_key = {.dtype = DType::kFloat32,
                  .shape = {2, 7, 4},
                  .data = keys.data(),
                  .byte_size = 2 * 7 * 4 * 4};
  in.index_weights = {.dtype = DType::kFloat32, .shape = {2, 5, 2}};
  const auto expect = [&](const std::string& message) {
    const absl::StatusOr<ProjectionsProblem> problem =
        ProjectionsProblem::Create(in, ProjectionsOptions{});
    ASSERT_FALSE(problem.ok());
    EXPECT_EQ(problem.status().message(), message);
  };
  in.row_valid = TensorView{.dtype = DType::kBool, .shape = {2, 4}};
  expect(
      "row_valid: shape must be [B, T] = [2, 5] (from query's shape), got "
      "[2, 4]");
  in.row_valid.reset();
  in.key_padding_mask = TensorView{.dtype = DType::kBool, .shape = {2, 6}};
  expect(
      "key_padding_mask: shape must be [B, S] = [2, 7] (S from key's shape, "
      "the rest from query's shape), got [2, 6]");
  in.key_padding_mask.reset();
  in.topk_indices = TensorView{.dtype = DType::kInt32, .shape = {2, 4, 3}};
  expect(
      "topk_indices: shape must be [B, T, K] = [2, 5, 3] (from query's "
      "shape), got [2, 4, 3]");
}

TEST(ProjectionsTest, OverflowingScoresAreRefused) {
  RefProjections p = RandomProblem(20, 1, 2, 3, 1, 1, 2, 1, 2);
  for (double& v : p.index_key) v *= 1e30;
  for (double& v : p.index_query) v = std::abs(v) * 1e30;
  for (double& v : p.index_key) v = std::abs(v);
  const LibraryRun run = RunLibrary(p);
  EXPECT_TRUE(absl::IsInvalidArgument(run.status)) << run.status;
  EXPECT_NE(run.status.message().find("indexer score"), std::string::npos)
      << run.status;
}

// A product that overflows float32 only at a key masked for its row takes
// no part in the loss, whichever mask hides the key: the answer is the
// float64 one, where nothing overflows. Row 0's key 3 has an indexer dot
// product (then, separately, a main logit) of 1e40; every other row's
// products with key 3 are small.
TEST(ProjectionsTest, OverflowAtAMaskedKeyIsNoError) {
  const float huge = 1e20f;
  std::vector<std::pair<std::string, RefProjections>> cases;
  {
    RefProjections p = RandomProblem(23, 1, 4, 4, 1, 1, 4, 1, 2);
    // Key 3 is masked for row 0 under each mask below.
    std::vector<std::pair<std::string, RefProjections>> masked;
    RefProjections m = p;
    m.options.causal = true;
    m.options.q_offset = 0;
    masked.emplace_back("causal", m);
    m = p;
    m.options.key_padding_mask = {1, 1, 1, 0};
    masked.emplace_back("key_padding_mask", m);
    m = p;
    m.options.attention_mask.assign(16, 1);
    m.options.attention_mask[3] = 0;
    masked.emplace_back("attention_mask", m);
    m = p;
    m.options.segment_ids_q = {0, 1, 1, 1};
    m.options.segment_ids_kv = {0, 0, 0, 1};
    masked.emplace_back("segments", m);
    for (auto& [name, q] : masked) {
      // index_query row 0 and index_key 3 meet in their dimension 0 only.
      RefProjections indexer = q;
      for (int64_t t = 0; t < 4; ++t) {
        indexer.index_query[t * 2] = t == 0 ? huge : 0.0;
        indexer.index_query[t * 2 + 1] =
            std::abs(indexer.index_query[t * 2 + 1]);
      }
      for (int64_t s = 0; s < 4; ++s)
        indexer.index_key[s * 2] = s == 3 ? huge : 0.0;
      cases.emplace_back(name + ", indexer", indexer);
      RefProjections logit = q;
      for (int64_t t = 0; t < 4; ++t) logit.query[t * 4] = t == 0 ? huge : 0.0;
      for (int64_t s = 0; s < 4; ++s) logit.key[s * 4] = s == 3 ? huge : 0.0;
      cases.emplace_back(name + ", main logit", logit);
    }
  }
  for (const auto& [name, p] : cases) {
    SCOPED_TRACE(name);
    ExpectMatchesReference(p);
  }
  // The sparse stage takes only valid slots; -inf main logits there are
  // probability 0, as in the dense stage.
  RefProjections sparse = RandomProblem(24, 1, 2, 4, 1, 1, 4, 1, 2);
  sparse.K = 3;
  sparse.topk_indices = {0, 1, 3, 0, 2, 3};
  for (int64_t t = 0; t < 2; ++t) sparse.query[t * 4] = t == 0 ? huge : 0.0;
  for (int64_t s = 0; s < 4; ++s) sparse.key[s * 4] = s == 3 ? -huge : 0.0;
  ExpectMatchesReference(sparse);
}

// A stop check is asked between the steps of each tile, not once a call or
// once a tile (one query row against many keys and heads is already hours
// of work): one that says go on leaves the bits as they were, and the first
// status it returns ends the computation with that status, nothing asked or
// computed after it. One tile here (T = 2) of 4 key tiles and 24 heads: the
// dense passes alone ask at each of their 2 * 4 * 24 turns.
TEST(ProjectionsTest, StopCheckIsAskedWithinEachTile) {
  struct Form {
    const char* name;
    int64_t topk;
    bool client_indices;
  };
  for (const Form form :
       {Form{"dense", 0, false}, Form{"server top-k", 300, false},
        Form{"client indices", 0, true}}) {
    SCOPED_TRACE(form.name);
    RefProjections p = RandomProblem(22, 1, 2, 2000, 24, 2, 8, 3, 4);
    if (form.client_indices) {
      p.K = 5;
      p.topk_indices = {0, 7, 1999, 500, -1, 3, 1024, 1023, 2, 1};
    }
    Extras x;
    x.topk = form.topk;
    x.threads = 1;
    const LibraryRun plain = RunLibrary(p, x);
    ASSERT_TRUE(plain.status.ok()) << plain.status;

    int asked = 0;
    x.stop = [&asked]() {
      ++asked;
      return absl::OkStatus();
    };
    const LibraryRun checked = RunLibrary(p, x);
    ASSERT_TRUE(checked.status.ok()) << checked.status;
    EXPECT_GE(asked, form.topk == 0 && !form.client_indices ? 2 * 4 * 24 : 4);
    EXPECT_EQ(checked.raw_dq, plain.raw_dq);
    EXPECT_EQ(checked.raw_dk, plain.raw_dk);
    EXPECT_EQ(checked.raw_dw, plain.raw_dw);
    EXPECT_EQ(checked.result.loss, plain.result.loss);

    // Stopped at each of its asks in turn: the stop's status, and no ask
    // after it.
    for (int stop_at = 1; stop_at <= asked; stop_at += std::max(1, asked / 7)) {
      SCOPED_TRACE(stop_at);
      int count = 0;
      x.stop = [&count, stop_at]() {
        return ++count < stop_at ? absl::OkStatus()
                                 : absl::DeadlineExceededError("out of time");
      };
      const LibraryRun stopped = RunLibrary(p, x);
      EXPECT_EQ(stopped.status, absl::DeadlineExceededError("out of time"));
      EXPECT_EQ(count, stop_at);
    }
  }
}

// Products past 2^26 multiply-adds run in steps (here the dense stage's
// indexer products, 128 rows * 64 heads by 512 keys by 64: four steps a key
// tile). They are still right, and their split follows from the shapes
// alone: the same bits whatever the threads and the stream's blocks.
TEST(ProjectionsTest, ProductsInStepsKeepTheirBitsWhateverTheSplitOfRows) {
  const RefProjections p = RandomProblem(25, 1, 128, 600, 1, 1, 4, 64, 64);
  ExpectMatchesReference(p);
  Extras one;
  one.threads = 1;
  const LibraryRun base = RunLibrary(p, one);
  ASSERT_TRUE(base.status.ok()) << base.status;
  Extras blocks;
  blocks.blocks = {37, 91};
  const LibraryRun blocked = RunLibrary(p, blocks);
  ASSERT_TRUE(blocked.status.ok()) << blocked.status;
  EXPECT_EQ(blocked.raw_dq, base.raw_dq);
  EXPECT_EQ(blocked.raw_dk, base.raw_dk);
  EXPECT_EQ(blocked.raw_dw, base.raw_dw);
  EXPECT_EQ(blocked.result.loss, base.result.loss);
}

// Between tiles too: the service's top-k uses 16-row tiles, so 200 rows are
// 13 tiles, each asking first. Stopped at the first ask of the second tile,
// the first tile's d_index_query rows are written and the rest untouched.
TEST(ProjectionsTest, StopCheckEndsTheComputationBetweenTiles) {
  RefProjections p = RandomProblem(22, 1, 200, 40, 1, 1, 4, 1, 4);
  Extras x;
  x.topk = 6;
  x.threads = 1;
  const LibraryRun plain = RunLibrary(p, x);
  ASSERT_TRUE(plain.status.ok()) << plain.status;

  // The asks of one tile: those of a run of the first tile's rows alone.
  RefProjections first = p;
  first.T = 16;
  for (std::vector<double>* v :
       {&first.query, &first.index_query, &first.index_weights}) {
    v->resize(v->size() / 200 * 16);
  }
  int per_tile = 0;
  x.stop = [&per_tile]() {
    ++per_tile;
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunLibrary(first, x).status.ok());

  int count = 0;
  x.stop = [&count, per_tile]() {
    return ++count <= per_tile ? absl::OkStatus()
                               : absl::DeadlineExceededError("out of time");
  };
  const LibraryRun stopped = RunLibrary(p, x);
  EXPECT_EQ(stopped.status, absl::DeadlineExceededError("out of time"));
  EXPECT_EQ(count, per_tile + 1);
  const int64_t tile_bytes = 16 * p.H_I * p.D_I * int64_t{sizeof(float)};
  ASSERT_EQ(stopped.raw_dq.size(), plain.raw_dq.size());
  EXPECT_TRUE(std::equal(plain.raw_dq.begin(),
                         plain.raw_dq.begin() + tile_bytes,
                         stopped.raw_dq.begin()));
  EXPECT_TRUE(std::all_of(stopped.raw_dq.begin() + tile_bytes,
                          stopped.raw_dq.end(),
                          [](std::byte b) { return b == std::byte{0}; }));
}

// The logits form's gradient is at most |c / N * grad_scale| per entry, which
// the options check keeps within the gradient dtype; the projections' gradients
// also grow with the projections, and with the rows or keys they sum over.
// One that leaves its dtype's range is refused, naming the output and the
// first entry, wherever it is written: per tile (d_index_query,
// d_index_weights) or at the end (d_index_key), unary or in blocks. The
// gradients are linear in grad_scale, so the float64 reference at
// grad_scale = 1 tells which scale takes which output past FP16's largest
// value (values up to 65519 still round to 65504).
TEST(ProjectionsTest, GradientsPastTheirDtypeAreRefusedNamingTheOutput) {
  // 64 copies of one query row against 2 keys: d_index_key adds the row's
  // part 64 times, the others sum over 2 keys.
  RefProjections p = RandomProblem(21, 1, 64, 2, 1, 1, 4, 1, 4);
  for (std::vector<double>* side :
       {&p.query, &p.index_query, &p.index_weights}) {
    const size_t width = side->size() / 64;
    for (size_t i = width; i < side->size(); ++i)
      (*side)[i] = (*side)[i % width];
  }
  p.options.reduction = RefReduction::kSum;
  const klref::RefProjectionsResult unit =
      klref::ComputeProjectionsReference(p);
  ASSERT_TRUE(unit.kl.error.empty()) << unit.kl.error;
  const double query_side =
      std::max(MaxAbs(unit.d_index_query), MaxAbs(unit.d_index_weights));
  const double key_side = MaxAbs(unit.d_index_key);
  ASSERT_GT(key_side, 1.3 * query_side);  // the case is what it says

  Extras fp16;
  fp16.grad_dtype = DType::kFloat16;
  // Only d_index_key past the range.
  p.options.grad_scale = 70000 / key_side;
  ASSERT_LT(p.options.grad_scale * query_side, 60000);
  ExpectInvalid(p, fp16,
                "d_index_key: the gradient must be finite in FP16 (lower "
                "grad_scale or scaling_factor, or ask for a wider "
                "grad_dtype), got NaN or infinity at (b=0, s=");
  // Keys 100 times larger take the query side's outputs past it as well
  // (|c / N * grad_scale| is at most 65504 in FP16); theirs, checked per tile,
  // come first.
  for (double& v : p.index_key) v = static_cast<float>(v * 100);
  p.options.grad_scale = 1;
  const klref::RefProjectionsResult large_keys =
      klref::ComputeProjectionsReference(p);
  ASSERT_TRUE(large_keys.kl.error.empty()) << large_keys.kl.error;
  p.options.grad_scale = 65504;
  ASSERT_GT(65504 * MaxAbs(large_keys.d_index_query), 70000);
  ExpectInvalid(p, fp16, "d_index_");
  const LibraryRun run = RunLibrary(p, fp16);
  EXPECT_EQ(run.status.message().find("d_index_key"), std::string::npos)
      << run.status;
  Extras blocks = fp16;
  blocks.blocks = {5, 3};
  EXPECT_EQ(RunLibrary(p, blocks).status, run.status);
  // In FP32 the same gradients are finite, and returned.
  ExpectMatchesReference(p);
}

}  // namespace
}  // namespace klserve
