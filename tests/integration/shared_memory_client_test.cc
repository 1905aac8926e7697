// Shared-memory regions through the C++ client (SharedMemoryRegion,
// RegisterRegion, RegionTensor, RegionSliceFor) against the real server
// (--shared_memory); shared_memory_test.cc covers the server's rules with
// raw calls. A request whose tensors lie in a registered region and
// whose outputs go there gives, read back from the region, the bits of the
// same request sent inline and the float64 reference's values, in both
// forms; the region calls (register, list, unregister) and their errors; the
// stream refusing regions; and a server without --shared_memory.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/shared_memory_region.h"
#include "proto/request_tensors.h"
#include "tests/integration/harness.h"
#include "tests/integration/reference_problems.h"
#include "tests/reference/indexer_kl_reference.h"
#include "tests/reference/projections_reference.h"

namespace klserve::integration {
namespace {

// Registered regions start this far into their object: slices are relative
// to the region, so a wrong base would read the wrong bytes.
constexpr int64_t kRegisterOffset = 4096;

// The outputs a request asks for, each with its slot in OutputRegions and
// its tensor in the response.
struct Output {
  v1::RegionSlice* (v1::OutputRegions::*slice)();
  v1::Tensor* (v1::ComputeLossResponse::*tensor)();
  std::string dtype;
  std::vector<int64_t> shape;
};

std::vector<int64_t> ShapeOf(const v1::Tensor& t) {
  return {t.shape().begin(), t.shape().end()};
}

// `request` with every tensor moved into one region and `outputs` placed
// after them, all at multiples of 64 bytes from the region's start (which
// is kRegisterOffset into the object).
struct Placed {
  SharedMemoryRegion object;
  std::string name;
  int64_t region_bytes = 0;
  v1::ComputeLossRequest request;
};

int64_t Align(int64_t offset) { return (offset + 63) / 64 * 64; }

absl::StatusOr<Placed> Place(const v1::ComputeLossRequest& request,
                             const std::vector<Output>& outputs,
                             const std::string& name) {
  int64_t size = 0;
  std::vector<int64_t> offsets;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (const v1::Tensor* t = FindTensor(request, tensor)) {
      size = Align(size);
      offsets.push_back(size);
      size += static_cast<int64_t>(t->data().size());
    }
  }
  std::vector<int64_t> output_offsets;
  for (const Output& output : outputs) {
    absl::StatusOr<v1::RegionSlice> slice =
        RegionSliceFor(output.dtype, output.shape, name, 0);
    if (!slice.ok()) return slice.status();
    size = Align(size);
    output_offsets.push_back(size);
    size += slice->byte_size();
  }
  absl::StatusOr<SharedMemoryRegion> object =
      SharedMemoryRegion::Create(kRegisterOffset + size);
  if (!object.ok()) return object.status();
  Placed placed{.object = *std::move(object),
                .name = name,
                .region_bytes = size,
                .request = request};
  std::byte* const base = placed.object.data() + kRegisterOffset;
  // Whatever the server should not read: a slice off by some bytes shows.
  std::memset(base, 0x7f, size);
  size_t next = 0;
  for (const RequestTensor& tensor : kRequestTensors) {
    if (FindTensor(request, tensor) == nullptr) continue;
    v1::Tensor* t = MutableTensor(placed.request, tensor);
    const int64_t offset = offsets[next++];
    std::memcpy(base + offset, t->data().data(), t->data().size());
    absl::StatusOr<v1::Tensor> in_region =
        RegionTensor(t->dtype(), ShapeOf(*t), name, offset);
    if (!in_region.ok()) return in_region.status();
    *t = *std::move(in_region);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    absl::StatusOr<v1::RegionSlice> slice = RegionSliceFor(
        outputs[i].dtype, outputs[i].shape, name, output_offsets[i]);
    if (!slice.ok()) return slice.status();
    *(placed.request.mutable_outputs()->*outputs[i].slice)() = *slice;
  }
  return placed;
}

// `response` with each output that names a region given the region's bytes
// as its data instead, after checking that it names exactly the slice the
// request asked for.
v1::ComputeLossResponse ReadBack(const Placed& placed,
                                 const std::vector<Output>& outputs,
                                 v1::ComputeLossResponse response) {
  v1::OutputRegions asked = placed.request.outputs();
  for (const Output& output : outputs) {
    v1::Tensor* tensor = (response.*output.tensor)();
    const v1::RegionSlice& slice = *(asked.*output.slice)();
    EXPECT_TRUE(tensor->has_region());
    EXPECT_TRUE(tensor->data().empty());
    EXPECT_EQ(tensor->dtype(), output.dtype);
    EXPECT_EQ(ShapeOf(*tensor), output.shape);
    EXPECT_EQ(tensor->region().region(), slice.region());
    EXPECT_EQ(tensor->region().offset(), slice.offset());
    EXPECT_EQ(tensor->region().byte_size(), slice.byte_size());
    const std::byte* bytes =
        placed.object.data() + kRegisterOffset + slice.offset();
    tensor->set_data(reinterpret_cast<const char*>(bytes), slice.byte_size());
    tensor->clear_region();
  }
  return response;
}

class SharedMemoryTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer({"--shared_memory"}));
  }

  // Registers `placed` under its name; fails the test otherwise.
  void Register(const Placed& placed) {
    absl::StatusOr<absl::Duration> lease = client().RegisterRegion(
        placed.name, placed.object.key(), kRegisterOffset, placed.region_bytes);
    ASSERT_TRUE(lease.ok()) << Describe(lease.status());
    EXPECT_GT(*lease, absl::ZeroDuration());
  }

  // The response of `placed`'s request (computed in the region) read back,
  // and the response of `inline_request` sent as bytes; with the server
  // holding no region afterwards.
  void Compute(const v1::ComputeLossRequest& inline_request,
               const std::vector<Output>& outputs,
               v1::ComputeLossResponse* from_region,
               v1::ComputeLossResponse* from_inline) {
    absl::StatusOr<Placed> placed =
        Place(inline_request, outputs, "test-region");
    ASSERT_TRUE(placed.ok()) << placed.status();
    ASSERT_NO_FATAL_FAILURE(Register(*placed));
    absl::StatusOr<v1::ComputeLossResponse> in_region =
        client().ComputeLoss(placed->request);
    ASSERT_TRUE(in_region.ok()) << Describe(in_region.status());
    *from_region = ReadBack(*placed, outputs, *std::move(in_region));
    absl::StatusOr<v1::ComputeLossResponse> sent =
        client().ComputeLoss(inline_request);
    ASSERT_TRUE(sent.ok()) << Describe(sent.status());
    *from_inline = *std::move(sent);
    EXPECT_TRUE(client().UnregisterRegion(placed->name).ok());
  }
};

struct LogitsCase {
  ProblemSpec spec;
  std::string grad_dtype;
};

void PrintTo(const LogitsCase& c, std::ostream* os) { *os << c.spec.name; }

std::vector<LogitsCase> LogitsCases() {
  std::vector<LogitsCase> cases;
  {
    // The shape of problem, small: dense, head-aggregated, FP32.
    ProblemSpec s;
    s.name = "DenseAggregatedFp32";
    s.B = 2, s.T = 16, s.S = 48, s.H = 0;
    s.options.set_causal(true);
    s.seed = 161;
    cases.push_back({s, "FP32"});
  }
  {
    // Per-head BF16 logits, the sparse stage, masks and segments: INT32 and
    // BOOL tensors in the region too, a BF16 gradient.
    ProblemSpec s;
    s.name = "SparsePerHeadBf16Masked";
    s.B = 2, s.T = 8, s.S = 24, s.H = 3, s.K = 6;
    s.target_dtype = "BF16";
    s.scores_dtype = "BF16";
    s.segments = true;
    s.key_padding = true;
    s.row_valid = true;
    s.options.set_reduction(v1::REDUCTION_MEAN_VALID);
    s.seed = 162;
    cases.push_back({s, "BF16"});
  }
  {
    ProblemSpec s;
    s.name = "DenseFp16AttentionMask";
    s.B = 1, s.T = 12, s.S = 20, s.H = 2;
    s.target_dtype = "FP16";
    s.scores_dtype = "FP16";
    s.attention_mask = true;
    s.options.set_flavor(v1::FLAVOR_MAXTEXT);
    s.seed = 163;
    cases.push_back({s, "FP16"});
  }
  return cases;
}

class SharedMemoryLogitsTest
    : public SharedMemoryTest,
      public ::testing::WithParamInterface<LogitsCase> {};

TEST_P(SharedMemoryLogitsTest, RegionGivesTheInlineBitsAndTheReference) {
  ProblemSpec spec = GetParam().spec;
  const std::string& grad_dtype = GetParam().grad_dtype;
  spec.options.set_grad_dtype(grad_dtype);
  spec.options.set_want_row_kl(true);
  spec.options.set_want_diagnostics(true);
  const v1::ComputeLossRequest request = MakeRequest(spec);
  const std::vector<int64_t> scores = ShapeOf(request.indexer_scores());
  const std::vector<Output> outputs = {
      {&v1::OutputRegions::mutable_grad, &v1::ComputeLossResponse::mutable_grad,
       grad_dtype, scores},
      {&v1::OutputRegions::mutable_row_kl,
       &v1::ComputeLossResponse::mutable_row_kl,
       "FP64",
       {scores[0], scores[1]}},
  };
  v1::ComputeLossResponse from_region, from_inline;
  ASSERT_NO_FATAL_FAILURE(
      Compute(request, outputs, &from_region, &from_inline));
  EXPECT_TRUE(SameResponse(from_inline, from_region));

  const klref::RefResult ref = klref::ComputeReference(RefProblemOf(request));
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  EXPECT_TRUE(CloseResult(ref, from_region, 1e-5));
  EXPECT_TRUE(
      CloseTensor(ref.grad, from_region.grad(), GradTolerance(grad_dtype)));
}

INSTANTIATE_TEST_SUITE_P(Problems, SharedMemoryLogitsTest,
                         ::testing::ValuesIn(LogitsCases()),
                         [](const ::testing::TestParamInfo<LogitsCase>& info) {
                           return info.param.spec.name;
                         });

TEST_F(SharedMemoryTest, ProjectionsFormInARegion) {
  ProjectionsSpec spec;
  spec.name = "projections";
  spec.B = 2, spec.T = 10, spec.S = 10, spec.H = 4, spec.H_kv = 2, spec.D = 8;
  spec.H_I = 3, spec.D_I = 4;
  spec.options.set_causal(true);
  spec.options.set_topk(4);  // the service's selection, an INT32 output
  spec.options.set_want_row_kl(true);
  spec.seed = 164;
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  const std::vector<Output> outputs = {
      {&v1::OutputRegions::mutable_d_index_query,
       &v1::ComputeLossResponse::mutable_d_index_query, "FP32",
       ShapeOf(request.index_query())},
      {&v1::OutputRegions::mutable_d_index_key,
       &v1::ComputeLossResponse::mutable_d_index_key, "FP32",
       ShapeOf(request.index_key())},
      {&v1::OutputRegions::mutable_d_index_weights,
       &v1::ComputeLossResponse::mutable_d_index_weights, "FP32",
       ShapeOf(request.index_weights())},
      {&v1::OutputRegions::mutable_topk_indices,
       &v1::ComputeLossResponse::mutable_topk_indices,
       "INT32",
       {spec.B, spec.T, 4}},
      {&v1::OutputRegions::mutable_row_kl,
       &v1::ComputeLossResponse::mutable_row_kl,
       "FP64",
       {spec.B, spec.T}},
  };
  v1::ComputeLossResponse from_region, from_inline;
  ASSERT_NO_FATAL_FAILURE(
      Compute(request, outputs, &from_region, &from_inline));
  EXPECT_TRUE(SameResponse(from_inline, from_region));

  const klref::RefProjectionsResult ref =
      klref::ComputeProjectionsReference(RefProjectionsOf(request));
  ASSERT_TRUE(ref.kl.error.empty()) << ref.kl.error;
  EXPECT_TRUE(CloseResult(ref.kl, from_region, 1e-5));
  const double tolerance = GradTolerance("FP32");
  EXPECT_TRUE(
      CloseTensor(ref.d_index_query, from_region.d_index_query(), tolerance));
  EXPECT_TRUE(
      CloseTensor(ref.d_index_key, from_region.d_index_key(), tolerance));
  EXPECT_TRUE(CloseTensor(ref.d_index_weights, from_region.d_index_weights(),
                          tolerance));
  EXPECT_EQ(DecodeInts(from_region.topk_indices()), ref.topk_indices);
}

// Inputs in the region, the gradient inline: the response carries it as
// bytes, as a plain call would.
TEST_F(SharedMemoryTest, InputsInARegionOutputsInline) {
  ProblemSpec spec;
  spec.name = "inputs-only";
  spec.B = 1, spec.T = 8, spec.S = 16, spec.H = 0;
  spec.seed = 165;
  const v1::ComputeLossRequest request = MakeRequest(spec);
  absl::StatusOr<Placed> placed = Place(request, {}, "inputs-only");
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_NO_FATAL_FAILURE(Register(*placed));
  absl::StatusOr<v1::ComputeLossResponse> in_region =
      client().ComputeLoss(placed->request);
  ASSERT_TRUE(in_region.ok()) << Describe(in_region.status());
  EXPECT_FALSE(in_region->grad().has_region());
  absl::StatusOr<v1::ComputeLossResponse> sent = client().ComputeLoss(request);
  ASSERT_TRUE(sent.ok()) << Describe(sent.status());
  EXPECT_TRUE(SameResponse(*sent, *in_region));
}

TEST_F(SharedMemoryTest, RegisterListUnregister) {
  absl::StatusOr<SharedMemoryRegion> object = SharedMemoryRegion::Create(8192);
  ASSERT_TRUE(object.ok()) << object.status();
  absl::StatusOr<absl::Duration> lease =
      client().RegisterRegion("r1", object->key(), 64, 4096);
  ASSERT_TRUE(lease.ok()) << Describe(lease.status());
  EXPECT_GT(*lease, absl::ZeroDuration());

  absl::StatusOr<v1::ListRegionsResponse> list = client().ListRegions();
  ASSERT_TRUE(list.ok()) << Describe(list.status());
  ASSERT_EQ(list->regions_size(), 1);
  EXPECT_EQ(list->regions(0).name(), "r1");
  EXPECT_EQ(list->regions(0).key(), object->key());
  EXPECT_EQ(list->regions(0).offset(), 64);
  EXPECT_EQ(list->regions(0).byte_size(), 4096);
  EXPECT_EQ(list->regions(0).users(), 0);
  EXPECT_GT(list->max_regions(), 0);
  EXPECT_GT(list->max_region_bytes(), 0);

  // The same values again renew it; other values under the name do not.
  EXPECT_TRUE(client().RegisterRegion("r1", object->key(), 64, 4096).ok());
  absl::StatusOr<absl::Duration> other =
      client().RegisterRegion("r1", object->key(), 0, 4096);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists)
      << Describe(other.status());

  EXPECT_TRUE(client().UnregisterRegion("r1").ok());
  EXPECT_EQ(client().UnregisterRegion("r1").code(),
            absl::StatusCode::kNotFound);
  list = client().ListRegions();
  ASSERT_TRUE(list.ok()) << Describe(list.status());
  EXPECT_EQ(list->regions_size(), 0);
}

TEST_F(SharedMemoryTest, AnUnknownRegionIsNotFoundNamingTheField) {
  ProblemSpec spec;
  spec.name = "unknown";
  spec.H = 0;
  absl::StatusOr<Placed> placed = Place(MakeRequest(spec), {}, "never-there");
  ASSERT_TRUE(placed.ok()) << placed.status();
  absl::StatusOr<v1::ComputeLossResponse> response =
      client().ComputeLoss(placed->request);
  ASSERT_EQ(response.status().code(), absl::StatusCode::kNotFound)
      << Describe(response.status());
  EXPECT_TRUE(absl::StrContains(response.status().message(), ".region"))
      << Describe(response.status());
  EXPECT_TRUE(absl::StrContains(response.status().message(), "never-there"))
      << Describe(response.status());
}

TEST_F(SharedMemoryTest, TheStreamRefusesRegionsBeforeSending) {
  ProblemSpec spec;
  spec.name = "stream";
  spec.H = 0;
  const v1::ComputeLossRequest request = MakeRequest(spec);
  absl::StatusOr<Placed> placed = Place(request, {}, "streamed");
  ASSERT_TRUE(placed.ok()) << placed.status();
  absl::StatusOr<v1::ComputeLossResponse> response =
      client().ComputeLossStreaming(placed->request);
  ASSERT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(response.status().message(),
                               "attention_weights.region:"))
      << Describe(response.status());

  // Outputs alone are refused too.
  v1::ComputeLossRequest outputs_only = request;
  *outputs_only.mutable_outputs()->mutable_grad() =
      *RegionSliceFor("FP32", ShapeOf(request.indexer_scores()), "streamed", 0);
  response = client().ComputeLossStreaming(outputs_only);
  ASSERT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(response.status().message(), "outputs:"))
      << Describe(response.status());
}

TEST(RegionHelpersTest, SlicesCountTheirBytes) {
  absl::StatusOr<v1::Tensor> tensor = RegionTensor("BF16", {2, 3, 5}, "r", 128);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype(), "BF16");
  EXPECT_EQ(ShapeOf(*tensor), (std::vector<int64_t>{2, 3, 5}));
  EXPECT_TRUE(tensor->data().empty());
  EXPECT_EQ(tensor->region().region(), "r");
  EXPECT_EQ(tensor->region().offset(), 128);
  EXPECT_EQ(tensor->region().byte_size(), 2 * 3 * 5 * 2);
  absl::StatusOr<v1::RegionSlice> row_kl =
      RegionSliceFor("FP64", {4, 7}, "r", 0);
  ASSERT_TRUE(row_kl.ok()) << row_kl.status();
  EXPECT_EQ(row_kl->byte_size(), 4 * 7 * 8);

  EXPECT_EQ(RegionTensor("FP8", {1}, "r", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegionSliceFor("FP32", {2, -1}, "r", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegionSliceFor("FP32", {2}, "r", -4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemoryOffTest, RegisterIsUnimplementedWithoutTheFlag) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  absl::StatusOr<SharedMemoryRegion> object = SharedMemoryRegion::Create(64);
  ASSERT_TRUE(object.ok()) << object.status();
  absl::StatusOr<absl::Duration> lease =
      client->RegisterRegion("off", object->key(), 0, 64);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnimplemented)
      << Describe(lease.status());
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << Describe(info.status());
  EXPECT_FALSE(info->shared_memory());
}

}  // namespace
}  // namespace klserve::integration
