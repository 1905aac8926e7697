// Shared-memory regions against the real server, with real POSIX
// shared-memory objects: inputs read from regions and outputs written into
// them give the inline answer bit for bit (and the float64 reference's);
// the region RPCs, names, offsets, sizes and limits are checked; regions in
// use cannot be unregistered, forgotten ones expire, and an object that
// shrinks or changes under a call never brings the server down.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "klserve/v1/klserve.pb.h"
#include "proto/request_tensors.h"
#include "tests/integration/harness.h"
#include "tests/integration/reference_problems.h"
#include "tests/reference/indexer_kl_reference.h"
#include "tests/shm/shm_object.h"

namespace klserve::integration {
namespace {

using testing_shm::ShmObject;

// Fills one object with a request's tensors and receives its outputs, like
// a client laying out one region per call shape.
class RegionLayout {
 public:
  RegionLayout(ShmObject& object, std::string region)
      : object_(object), region_(std::move(region)) {}

  // Moves `tensor`'s bytes into the object, leaving a slice in their place.
  void MoveIn(v1::Tensor& tensor) {
    const int64_t bytes = static_cast<int64_t>(tensor.data().size());
    v1::RegionSlice* slice = tensor.mutable_region();
    *slice = Next(bytes);
    std::memcpy(object_.data() + slice->offset(), tensor.data().data(), bytes);
    tensor.clear_data();
  }
  // A slice of `bytes` for an output.
  v1::RegionSlice Next(int64_t bytes) {
    v1::RegionSlice slice;
    slice.set_region(region_);
    slice.set_offset(used_);
    slice.set_byte_size(bytes);
    used_ += (bytes + 63) / 64 * 64;  // 64-byte aligned, as a client would
    EXPECT_LE(used_, object_.byte_size());
    return slice;
  }
  // A response tensor the server wrote into the object, as an inline one.
  v1::Tensor Inline(const v1::Tensor& written) const {
    v1::Tensor out = written;
    out.clear_region();
    out.set_data(std::string(reinterpret_cast<const char*>(object_.data()) +
                                 written.region().offset(),
                             written.region().byte_size()));
    return out;
  }

 private:
  ShmObject& object_;
  std::string region_;
  int64_t used_ = 0;
};

// Every tensor a response may carry, read back from the object.
v1::ComputeLossResponse InlineResponse(const v1::ComputeLossResponse& written,
                                       const RegionLayout& layout) {
  v1::ComputeLossResponse out = written;
  const auto back = [&](v1::Tensor* tensor) {
    if (tensor->has_region()) *tensor = layout.Inline(*tensor);
  };
  if (out.has_grad()) back(out.mutable_grad());
  if (out.has_row_kl()) back(out.mutable_row_kl());
  if (out.has_d_index_query()) back(out.mutable_d_index_query());
  if (out.has_d_index_key()) back(out.mutable_d_index_key());
  if (out.has_d_index_weights()) back(out.mutable_d_index_weights());
  if (out.has_topk_indices()) back(out.mutable_topk_indices());
  return out;
}

int64_t ElementCount(const v1::Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= d;
  return n;
}

int64_t ElementSize(const std::string& dtype) {
  if (dtype == "FP64") return 8;
  if (dtype == "FP32" || dtype == "INT32") return 4;
  if (dtype == "BOOL") return 1;
  return 2;
}

class SharedMemoryTest : public ServerTest {
 protected:
  void Start(std::vector<std::string> flags = {}) {
    flags.insert(flags.begin(), "--shared_memory");
    StartServer(flags);
    stub_ = MakeStub(server().target());
  }

  grpc::Status Register(const std::string& name, const std::string& key,
                        int64_t offset, int64_t byte_size,
                        v1::RegisterRegionResponse* out = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::RegisterRegionRequest request;
    request.set_name(name);
    request.set_key(key);
    request.set_offset(offset);
    request.set_byte_size(byte_size);
    v1::RegisterRegionResponse response;
    grpc::Status status = stub_->RegisterRegion(&context, request, &response);
    if (out != nullptr) *out = response;
    return status;
  }
  grpc::Status Unregister(const std::string& name) {
    grpc::ClientContext context;
    v1::UnregisterRegionRequest request;
    request.set_name(name);
    v1::UnregisterRegionResponse response;
    return stub_->UnregisterRegion(&context, request, &response);
  }
  v1::ListRegionsResponse List() {
    grpc::ClientContext context;
    v1::ListRegionsResponse response;
    const grpc::Status status =
        stub_->ListRegions(&context, v1::ListRegionsRequest(), &response);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return response;
  }

  std::unique_ptr<v1::IndexerKl::Stub> stub_;
};

void ExpectCode(const absl::Status& status, absl::StatusCode code,
                absl::string_view field) {
  EXPECT_EQ(status.code(), code) << Describe(status);
  EXPECT_TRUE(absl::StartsWith(status.message(), field)) << Describe(status);
}
void ExpectCode(const grpc::Status& status, grpc::StatusCode code,
                absl::string_view field) {
  EXPECT_EQ(status.error_code(), code) << Describe(status);
  EXPECT_TRUE(absl::StartsWith(status.error_message(), field))
      << Describe(status);
}

// A sparse per-head problem with every kind of input: float logits and
// scores (read in place), INT32 indices and BOOL row_valid (copied).
ProblemSpec SparseSpec() {
  ProblemSpec spec;
  spec.name = "shm";
  spec.B = 2, spec.T = 6, spec.S = 16, spec.H = 3, spec.K = 5;
  spec.row_valid = true;
  spec.segments = true;
  spec.options.set_want_row_kl(true);
  spec.options.set_want_diagnostics(true);
  spec.options.set_recall_k(2);
  spec.seed = 91;
  return spec;
}

// Every tensor of `request` into the layout's region.
void MoveAllIn(v1::ComputeLossRequest& request, RegionLayout& layout) {
  for (const RequestTensor& tensor : kRequestTensors) {
    if (FindTensor(request, tensor) != nullptr) {
      layout.MoveIn(*MutableTensor(request, tensor));
    }
  }
}

TEST_F(SharedMemoryTest, LogitsFormThroughARegionIsTheInlineAnswer) {
  Start();
  const v1::ComputeLossRequest inline_request = MakeRequest(SparseSpec());
  absl::StatusOr<v1::ComputeLossResponse> inline_response =
      client().ComputeLossUnary(inline_request);
  ASSERT_TRUE(inline_response.ok()) << Describe(inline_response.status());

  ShmObject object(1 << 20);
  ASSERT_TRUE(Register("step", object.key(), 0, object.byte_size()).ok());
  RegionLayout layout(object, "step");
  v1::ComputeLossRequest request = inline_request;
  MoveAllIn(request, layout);
  *request.mutable_outputs()->mutable_grad() =
      layout.Next(ElementCount(inline_response->grad()) * 4);
  *request.mutable_outputs()->mutable_row_kl() =
      layout.Next(ElementCount(inline_response->row_kl()) * 8);
  // Twice: the region is reused as a training loop reuses it.
  for (int call = 0; call < 2; ++call) {
    absl::StatusOr<v1::ComputeLossResponse> written =
        client().ComputeLossUnary(request);
    ASSERT_TRUE(written.ok()) << Describe(written.status());
    EXPECT_TRUE(written->grad().data().empty());
    EXPECT_EQ(written->grad().region().region(), "step");
    const v1::ComputeLossResponse got = InlineResponse(*written, layout);
    EXPECT_TRUE(SameResponse(*inline_response, got));
    const klref::RefResult ref =
        klref::ComputeReference(RefProblemOf(inline_request));
    ASSERT_TRUE(ref.error.empty()) << ref.error;
    EXPECT_TRUE(CloseResult(ref, got, 1e-5));
    EXPECT_TRUE(CloseTensor(ref.grad, got.grad(), GradTolerance("FP32")));
  }
  const v1::ListRegionsResponse list = List();
  ASSERT_EQ(list.regions_size(), 1);
  EXPECT_EQ(list.regions(0).users(), 0);
  EXPECT_TRUE(Unregister("step").ok());
}

TEST_F(SharedMemoryTest, ProjectionsFormThroughARegionIsTheInlineAnswer) {
  Start();
  ProjectionsSpec spec;
  spec.name = "shm";
  spec.B = 1, spec.T = 20, spec.S = 20;
  spec.options.set_causal(true);
  spec.options.set_topk(4);
  spec.options.set_want_row_kl(true);
  spec.seed = 92;
  const v1::ComputeLossRequest inline_request = MakeProjectionsRequest(spec);
  absl::StatusOr<v1::ComputeLossResponse> inline_response =
      client().ComputeLossUnary(inline_request);
  ASSERT_TRUE(inline_response.ok()) << Describe(inline_response.status());

  ShmObject object(1 << 20);
  ASSERT_TRUE(Register("p", object.key(), 0, object.byte_size()).ok());
  RegionLayout layout(object, "p");
  v1::ComputeLossRequest request = inline_request;
  MoveAllIn(request, layout);
  v1::OutputRegions& outputs = *request.mutable_outputs();
  const auto bytes = [](const v1::Tensor& t) {
    return ElementCount(t) * ElementSize(t.dtype());
  };
  *outputs.mutable_d_index_query() =
      layout.Next(bytes(inline_response->d_index_query()));
  *outputs.mutable_d_index_key() =
      layout.Next(bytes(inline_response->d_index_key()));
  *outputs.mutable_d_index_weights() =
      layout.Next(bytes(inline_response->d_index_weights()));
  *outputs.mutable_topk_indices() =
      layout.Next(bytes(inline_response->topk_indices()));
  *outputs.mutable_row_kl() = layout.Next(bytes(inline_response->row_kl()));
  absl::StatusOr<v1::ComputeLossResponse> written =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(written.ok()) << Describe(written.status());
  EXPECT_TRUE(SameResponse(*inline_response, InlineResponse(*written, layout)));
}

TEST_F(SharedMemoryTest, RegionRpcsRenewConflictListAndUnregister) {
  Start();
  ShmObject object(64 << 10);
  v1::RegisterRegionResponse registered;
  ASSERT_TRUE(Register("a", object.key(), 4096, 1000, &registered).ok());
  EXPECT_EQ(registered.lease_seconds(), 600);
  EXPECT_TRUE(Register("a", object.key(), 4096, 1000).ok());  // renews
  ExpectCode(Register("a", object.key(), 0, 1000), grpc::ALREADY_EXISTS,
             "name:");
  ASSERT_TRUE(Register("b", object.key(), 0, 10).ok());
  const v1::ListRegionsResponse list = List();
  ASSERT_EQ(list.regions_size(), 2);
  EXPECT_EQ(list.regions(0).name(), "a");
  EXPECT_EQ(list.regions(0).key(), object.key());
  EXPECT_EQ(list.regions(0).offset(), 4096);
  EXPECT_EQ(list.regions(0).byte_size(), 1000);
  EXPECT_EQ(list.regions(0).users(), 0);
  EXPECT_GT(list.regions(0).lease_left_seconds(), 590);
  EXPECT_EQ(list.max_regions(), 64);
  EXPECT_EQ(list.max_region_bytes(), int64_t{16} << 30);
  // What Grafana sees.
  EXPECT_TRUE(absl::StrContains(ScrapeMetrics(server().metrics_port()),
                                "\nklserve_shared_memory_regions 2\n"));
  EXPECT_TRUE(absl::StrContains(ScrapeMetrics(server().metrics_port()),
                                "\nklserve_shared_memory_region_bytes 1010\n"));
  EXPECT_TRUE(Unregister("a").ok());
  ExpectCode(Unregister("a"), grpc::NOT_FOUND, "name:");
  EXPECT_EQ(List().regions_size(), 1);
  EXPECT_TRUE(absl::StrContains(ScrapeMetrics(server().metrics_port()),
                                "\nklserve_shared_memory_regions 1\n"));
  absl::StatusOr<v1::GetServerInfoResponse> info = client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->shared_memory());
}

TEST_F(SharedMemoryTest, NamesAreNeverPaths) {
  Start();
  ShmObject object(4096);
  for (const char* key :
       {"../../etc/passwd", "/etc/passwd", "a/b", "..", ".", ".hidden", ""}) {
    ExpectCode(Register("r", key, 0, 1), grpc::INVALID_ARGUMENT, "key:");
  }
  ExpectCode(Register("../r", object.key(), 0, 1), grpc::INVALID_ARGUMENT,
             "name:");
  ExpectCode(Register("r", "klserve-test-no-such-object", 0, 1),
             grpc::NOT_FOUND, "key:");
  const std::string link = absl::StrCat("klserve-test-link-", getpid());
  ASSERT_EQ(symlink(("/dev/shm/" + object.key()).c_str(),
                    ("/dev/shm/" + link).c_str()),
            0);
  const grpc::Status linked = Register("r", link, 0, 1);
  unlink(("/dev/shm/" + link).c_str());
  ExpectCode(linked, grpc::INVALID_ARGUMENT, "key:");
  ExpectCode(Register("r", object.key(), 0, 4097), grpc::INVALID_ARGUMENT,
             "byte_size:");
  ExpectCode(Register("r", object.key(), INT64_MAX - 1, 8),
             grpc::INVALID_ARGUMENT, "byte_size:");
  EXPECT_EQ(List().regions_size(), 0);
}

TEST_F(SharedMemoryTest, SlicesAreCheckedAgainstTheRegion) {
  Start();
  ShmObject object(1 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, 1 << 20).ok());
  const v1::ComputeLossRequest base = MakeRequest(SparseSpec());
  RegionLayout layout(object, "r");
  v1::ComputeLossRequest good = base;
  MoveAllIn(good, layout);
  const auto expect = [&](const v1::ComputeLossRequest& request,
                          absl::StatusCode code, absl::string_view field) {
    ExpectCode(client().ComputeLossUnary(request).status(), code, field);
  };
  {
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->mutable_region()->set_offset((1 << 20) - 8);
    expect(r, absl::StatusCode::kInvalidArgument,
           "indexer_scores.region.byte_size:");
  }
  {
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->mutable_region()->set_offset(INT64_MAX);
    expect(r, absl::StatusCode::kInvalidArgument,
           "indexer_scores.region.offset:");
  }
  {
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->mutable_region()->set_byte_size(INT64_MAX);
    expect(r, absl::StatusCode::kInvalidArgument,
           "indexer_scores.region.byte_size:");
  }
  {
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->mutable_region()->set_offset(2);
    expect(r, absl::StatusCode::kInvalidArgument,
           "indexer_scores.region.offset:");
  }
  {
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->mutable_region()->set_region("other");
    expect(r, absl::StatusCode::kNotFound, "indexer_scores.region.region:");
  }
  {
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->set_data(std::string(4, '\0'));
    expect(r, absl::StatusCode::kInvalidArgument, "indexer_scores:");
  }
  {
    // The right bytes for a wrong shape: the kernels' own check.
    v1::ComputeLossRequest r = good;
    r.mutable_indexer_scores()->mutable_region()->set_byte_size(8);
    expect(r, absl::StatusCode::kInvalidArgument, "indexer_scores");
  }
  for (const int64_t last : {int64_t{1}, int64_t{0}}) {
    // A hostile shape is quoted by its first 8 dimensions, as inline.
    v1::ComputeLossRequest r = good;
    v1::Tensor& scores = *r.mutable_indexer_scores();
    scores.clear_shape();
    for (int i = 0; i < 100000; ++i) scores.add_shape(1);
    scores.add_shape(last);
    const absl::Status status = client().ComputeLossUnary(r).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_LT(status.message().size(), 400u) << status.message().size();
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  "[1, 1, 1, 1, 1, 1, 1, 1, ...] (100001 "
                                  "dimensions)"))
        << status.message().substr(0, 400);
  }
  const int64_t grad_bytes = 2 * 6 * 5 * 4;
  {
    v1::ComputeLossRequest r = good;
    v1::RegionSlice* grad = r.mutable_outputs()->mutable_grad();
    *grad = layout.Next(grad_bytes);
    grad->set_byte_size(grad_bytes - 4);
    expect(r, absl::StatusCode::kInvalidArgument, "outputs.grad.byte_size:");
  }
  {
    v1::ComputeLossRequest r = good;
    *r.mutable_outputs()->mutable_grad() = r.indexer_scores().region();
    expect(r, absl::StatusCode::kInvalidArgument, "outputs.grad:");
  }
  {
    v1::ComputeLossRequest r = good;
    *r.mutable_outputs()->mutable_grad() = layout.Next(grad_bytes);
    *r.mutable_outputs()->mutable_d_index_key() = layout.Next(64);
    expect(r, absl::StatusCode::kInvalidArgument, "outputs.d_index_key:");
  }
  {
    v1::ComputeLossRequest r = good;
    r.mutable_options()->set_skip_grad(true);
    *r.mutable_outputs()->mutable_grad() = layout.Next(grad_bytes);
    expect(r, absl::StatusCode::kInvalidArgument, "outputs.grad:");
  }
  // None of it left the region held.
  EXPECT_EQ(List().regions(0).users(), 0);
}

// Copies of INT32 and BOOL inputs are bounded before they are made: by the
// tensor's shape, and by --max_tensor_bytes.
TEST_F(SharedMemoryTest, CopiedInputsAreBoundedFirst) {
  Start({"--max_tensor_bytes=4096"});
  ShmObject object(1 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, 1 << 20).ok());
  ProblemSpec spec = SparseSpec();
  spec.segments = false;
  v1::ComputeLossRequest request = MakeRequest(spec);
  RegionLayout layout(object, "r");
  MoveAllIn(request, layout);
  v1::ComputeLossRequest wide = request;
  wide.mutable_row_valid()->mutable_region()->set_byte_size(1 << 19);
  ExpectCode(client().ComputeLossUnary(wide).status(),
             absl::StatusCode::kInvalidArgument, "row_valid.region.byte_size:");
  // Shaped as big as the slice: past the per-tensor limit, uncopied.
  v1::ComputeLossRequest big = request;
  big.mutable_row_valid()->clear_shape();
  big.mutable_row_valid()->add_shape(1);
  big.mutable_row_valid()->add_shape(1 << 19);
  big.mutable_row_valid()->mutable_region()->set_byte_size(1 << 19);
  ExpectCode(client().ComputeLossUnary(big).status(),
             absl::StatusCode::kResourceExhausted, "row_valid:");
}

// The message limit weighs what the response carries: a gradient placed in
// a region is not in it.
TEST_F(SharedMemoryTest, OutputsInARegionAreNotInTheMessage) {
  Start({"--max_message_bytes=100000"});
  ShmObject object(4 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, 4 << 20).ok());
  const v1::ComputeLossRequest inline_request = MakeRequest(WideSpec(16, 94));
  v1::ComputeLossRequest request = inline_request;
  RegionLayout layout(object, "r");
  MoveAllIn(request, layout);
  // The gradient inline: 256 KiB, over the limit.
  ExpectCode(client().ComputeLossUnary(request).status(),
             absl::StatusCode::kResourceExhausted, "grad:");
  *request.mutable_outputs()->mutable_grad() = layout.Next(16 * 4096 * 4);
  absl::StatusOr<v1::ComputeLossResponse> written =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(written.ok()) << Describe(written.status());
  const klref::RefResult ref =
      klref::ComputeReference(RefProblemOf(inline_request));
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const v1::ComputeLossResponse got = InlineResponse(*written, layout);
  EXPECT_TRUE(CloseResult(ref, got, 1e-5));
  EXPECT_TRUE(CloseTensor(ref.grad, got.grad(), GradTolerance("FP32")));
}

// An output left in the message while others go to regions is weighed
// before anything is computed or allocated: the key gradient inline (128 KiB
// here) passes a 100000-byte limit though the query-side ones are placed.
TEST_F(SharedMemoryTest, AnOutputLeftInTheMessageIsWeighedBeforeComputing) {
  Start({"--max_message_bytes=100000"});
  ProjectionsSpec spec;
  spec.name = "partly placed";
  spec.T = 8, spec.S = 8192;
  spec.seed = 95;
  ShmObject object(4 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, 4 << 20).ok());
  RegionLayout layout(object, "r");
  v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  MoveAllIn(request, layout);
  v1::OutputRegions& outputs = *request.mutable_outputs();
  *outputs.mutable_d_index_query() =
      layout.Next(spec.T * spec.H_I * spec.D_I * 4);
  *outputs.mutable_d_index_weights() = layout.Next(spec.T * spec.H_I * 4);
  const absl::Status refused = client().ComputeLossUnary(request).status();
  ExpectCode(refused, absl::StatusCode::kResourceExhausted, "d_index_key:");
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "the response would carry at least 131072"))
      << Describe(refused);
  *outputs.mutable_d_index_key() = layout.Next(spec.S * spec.D_I * 4);
  EXPECT_TRUE(client().ComputeLossUnary(request).ok());
}

// A response whose outputs fit the message limit but whose encoding does
// not is blamed on the largest output it carries, not on one placed in a
// region: here d_index_query, though the placed d_index_key is larger.
TEST_F(SharedMemoryTest, AnEncodingPastTheLimitNamesTheLargestOutputInIt) {
  ProjectionsSpec spec;
  spec.name = "key gradient placed";
  spec.T = 8, spec.S = 4096;
  spec.H_I = 4, spec.D_I = 16;  // d_index_query 2 KiB, d_index_key 256 KiB
  spec.seed = 96;
  const int64_t query_gradient = spec.T * spec.H_I * spec.D_I * 4;
  const int64_t weights_gradient = spec.T * spec.H_I * 4;
  // The outputs' bytes fit; their tensors' dtype and shape, and the
  // result, do not.
  Start({absl::StrCat("--max_message_bytes=",
                      query_gradient + weights_gradient + 16)});
  ShmObject object(4 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, 4 << 20).ok());
  RegionLayout layout(object, "r");
  v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  MoveAllIn(request, layout);
  request.mutable_options()->set_want_row_kl(false);
  v1::OutputRegions& outputs = *request.mutable_outputs();
  *outputs.mutable_d_index_key() = layout.Next(spec.S * spec.D_I * 4);
  // d_index_weights stays in the message too: the smaller of the two.
  const absl::Status refused = client().ComputeLossUnary(request).status();
  ExpectCode(refused, absl::StatusCode::kResourceExhausted, "d_index_query:");
  *outputs.mutable_d_index_query() = layout.Next(query_gradient);
  EXPECT_TRUE(client().ComputeLossUnary(request).ok());
}

TEST_F(SharedMemoryTest, StreamsCarryTheirBytes) {
  Start();
  ShmObject object(4096);
  ASSERT_TRUE(Register("r", object.key(), 0, 4096).ok());
  v1::ComputeLossStreamRequest header;
  v1::StreamHeader& h = *header.mutable_header();
  h.mutable_indexer_scores()->set_dtype("FP32");
  h.mutable_indexer_scores()->add_shape(1);
  h.mutable_indexer_scores()->add_shape(1);
  h.mutable_indexer_scores()->add_shape(4);
  *h.mutable_attention_weights() = h.indexer_scores();
  v1::Tensor& valid = *h.mutable_row_valid();
  valid.set_dtype("BOOL");
  valid.add_shape(1);
  valid.add_shape(1);
  valid.mutable_region()->set_region("r");
  valid.mutable_region()->set_byte_size(1);
  const StreamOutcome outcome = RunStream(*stub_, {header});
  ExpectCode(outcome.status, grpc::INVALID_ARGUMENT, "row_valid.region:");
}

TEST_F(SharedMemoryTest, LimitsOnRegionsAndBytes) {
  Start({"--max_regions=2", "--max_region_bytes=10000"});
  ShmObject object(64 << 10);
  ASSERT_TRUE(Register("a", object.key(), 0, 6000).ok());
  ExpectCode(Register("b", object.key(), 0, 4001), grpc::RESOURCE_EXHAUSTED,
             "byte_size:");
  ASSERT_TRUE(Register("b", object.key(), 0, 4000).ok());
  ExpectCode(Register("c", object.key(), 0, 1), grpc::RESOURCE_EXHAUSTED,
             "name:");
  const v1::ListRegionsResponse list = List();
  EXPECT_EQ(list.max_regions(), 2);
  EXPECT_EQ(list.max_region_bytes(), 10000);
}

// A call computing from a region holds it: unregistering it meanwhile is
// refused, and allowed once the call has finished.
TEST_F(SharedMemoryTest, UnregisterIsRefusedWhileACallUsesTheRegion) {
  Start();
  // Large enough (per-head logits, 64 MiB) to take a while on 2 threads.
  ProblemSpec spec;
  spec.name = "busy";
  spec.B = 1, spec.T = 1024, spec.S = 2048, spec.H = 8;
  spec.seed = 93;
  v1::ComputeLossRequest request = MakeRequest(spec);
  ShmObject object(80 << 20);
  ASSERT_TRUE(Register("busy", object.key(), 0, object.byte_size()).ok());
  RegionLayout layout(object, "busy");
  MoveAllIn(request, layout);
  bool refused = false;
  for (int attempt = 0; attempt < 5 && !refused; ++attempt) {
    std::atomic<bool> done{false};
    absl::Status call_status;
    std::thread call([&] {
      call_status = client().ComputeLossUnary(request).status();
      done = true;
    });
    while (!done) {
      const v1::ListRegionsResponse list = List();
      if (list.regions_size() == 1 && list.regions(0).users() == 1) {
        const grpc::Status status = Unregister("busy");
        ExpectCode(status, grpc::FAILED_PRECONDITION, "name:");
        refused = status.error_code() == grpc::FAILED_PRECONDITION;
        break;
      }
    }
    call.join();
    EXPECT_TRUE(call_status.ok()) << Describe(call_status);
  }
  EXPECT_TRUE(refused) << "no attempt saw the call holding the region";
  EXPECT_TRUE(Unregister("busy").ok());
}

TEST_F(SharedMemoryTest, ForgottenRegionsExpire) {
  Start({"--region_lease=1s"});
  ShmObject object(4096);
  v1::RegisterRegionResponse registered;
  ASSERT_TRUE(Register("r", object.key(), 0, 4096, &registered).ok());
  EXPECT_EQ(registered.lease_seconds(), 1);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (List().regions_size() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(List().regions_size(), 0);
}

// The client shrinks its object after registering it: the server's reads
// past the new end would be SIGBUS. The call fails, the server lives on,
// and so does every other region.
TEST_F(SharedMemoryTest, AnObjectShrunkUnderTheServerFailsTheCallOnly) {
  Start();
  const v1::ComputeLossRequest inline_request = MakeRequest(SparseSpec());
  auto shrinking = std::make_unique<ShmObject>(1 << 20);
  ShmObject healthy(1 << 20);
  ASSERT_TRUE(Register("shrinks", shrinking->key(), 0, 1 << 20).ok());
  ASSERT_TRUE(Register("healthy", healthy.key(), 0, 1 << 20).ok());
  v1::ComputeLossRequest request = inline_request;
  RegionLayout layout(*shrinking, "shrinks");
  MoveAllIn(request, layout);
  *request.mutable_outputs()->mutable_grad() = layout.Next(2 * 6 * 5 * 4);
  shrinking->Truncate(0);
  for (int call = 0; call < 2; ++call) {
    ExpectCode(client().ComputeLossUnary(request).status(),
               absl::StatusCode::kFailedPrecondition, "region 'shrinks'");
  }
  // Shrinking and regrowing while calls read: some read past the end
  // (SIGBUS in the server, caught), each fails or answers.
  std::atomic<bool> stop{false};
  std::thread shrinker([&] {
    for (int i = 0; !stop; ++i) shrinking->Truncate(i % 2 ? 1 << 20 : 4096);
  });
  for (int call = 0; call < 40; ++call) {
    const absl::Status status = client().ComputeLossUnary(request).status();
    EXPECT_TRUE(status.ok() ||
                status.code() == absl::StatusCode::kFailedPrecondition ||
                status.code() == absl::StatusCode::kInvalidArgument)
        << Describe(status);
  }
  stop = true;
  shrinker.join();
  v1::ComputeLossRequest other = inline_request;
  RegionLayout healthy_layout(healthy, "healthy");
  MoveAllIn(other, healthy_layout);
  absl::StatusOr<v1::ComputeLossResponse> fine =
      client().ComputeLossUnary(other);
  ASSERT_TRUE(fine.ok()) << Describe(fine.status());
  absl::StatusOr<v1::ComputeLossResponse> expected =
      client().ComputeLossUnary(inline_request);
  ASSERT_TRUE(expected.ok());
  EXPECT_TRUE(SameResponse(*expected, *fine));
  EXPECT_TRUE(Unregister("shrinks").ok());
}

// A job that restarts with a fixed key: its new object under the old key is
// not what the server mapped. Calls on the old registration fail rather
// than read the removed object; registering again maps the new one.
TEST_F(SharedMemoryTest, AnObjectReplacedUnderItsKeyIsNeverServedStale) {
  Start();
  ProblemSpec spec = SparseSpec();
  const v1::ComputeLossRequest first = MakeRequest(spec);
  spec.seed = 92;
  const v1::ComputeLossRequest second = MakeRequest(spec);
  auto old_object = std::make_unique<ShmObject>(1 << 20);
  const std::string key = old_object->key();
  ASSERT_TRUE(Register("job", key, 0, 1 << 20).ok());
  v1::ComputeLossRequest request = first;
  RegionLayout old_layout(*old_object, "job");
  MoveAllIn(request, old_layout);
  ASSERT_TRUE(client().ComputeLossUnary(request).ok());

  old_object->Unlink();
  ShmObject new_object(1 << 20, key);
  request = second;
  RegionLayout new_layout(new_object, "job");
  MoveAllIn(request, new_layout);
  ExpectCode(client().ComputeLossUnary(request).status(),
             absl::StatusCode::kFailedPrecondition, "region 'job'");
  ASSERT_TRUE(Register("job", key, 0, 1 << 20).ok());
  absl::StatusOr<v1::ComputeLossResponse> through_region =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(through_region.ok()) << Describe(through_region.status());
  absl::StatusOr<v1::ComputeLossResponse> expected =
      client().ComputeLossUnary(second);
  ASSERT_TRUE(expected.ok()) << Describe(expected.status());
  EXPECT_TRUE(SameResponse(*expected, *through_region));
  EXPECT_TRUE(Unregister("job").ok());
}

// A client rewriting its inputs while the server reads them gets an error
// or a finite answer, never a crash, whatever it writes: NaN, infinities,
// garbage indices.
TEST_F(SharedMemoryTest, InputsRewrittenDuringCallsNeverCrashTheServer) {
  Start();
  ProblemSpec spec = SparseSpec();
  spec.B = 4, spec.T = 64, spec.S = 256, spec.K = 32;
  v1::ComputeLossRequest request = MakeRequest(spec);
  ShmObject object(8 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, object.byte_size()).ok());
  RegionLayout layout(object, "r");
  MoveAllIn(request, layout);
  *request.mutable_outputs()->mutable_grad() =
      layout.Next(spec.B * spec.T * spec.K * 4);
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    const uint32_t patterns[] = {0x7fc00000u, 0x7f800000u, 0xff800000u,
                                 0xffffffffu, 0x80000000u, 0x12345678u};
    auto* words = reinterpret_cast<uint32_t*>(object.data());
    const int64_t n = object.byte_size() / 4;
    uint64_t i = 0;
    while (!stop) {
      words[(i * 2654435761u) % n] = patterns[i % 6];
      ++i;
    }
  });
  int answered = 0;
  for (int call = 0; call < 30; ++call) {
    absl::StatusOr<v1::ComputeLossResponse> response =
        client().ComputeLossUnary(request);
    if (response.ok()) {
      EXPECT_TRUE(std::isfinite(response->result().loss()));
      ++answered;
    } else {
      EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument)
          << Describe(response.status());
    }
  }
  stop = true;
  vandal.join();
  RecordProperty("answered", answered);
  // The server still answers correctly.
  const v1::ComputeLossRequest clean = MakeRequest(SparseSpec());
  EXPECT_TRUE(client().ComputeLossUnary(clean).ok());
}

// The kernels read an input more than once (a check, then the math): a
// value the client rewrites between the reads escapes the check. Whatever
// comes out, an answer is sent only when its every number is finite; one
// with a NaN or an infinity in its gradient, row KL, loss or diagnostics is
// refused naming the region. The gradient goes in the message here, out of
// the vandal's reach. A race: without the checks, a few answers in a
// thousand came back OK with a non-finite gradient.
TEST_F(SharedMemoryTest, AnswersFromRewrittenInputsAreFiniteOrRefused) {
  Start();
  ProblemSpec spec;
  spec.name = "rewritten";
  spec.B = 1, spec.T = 64, spec.S = 2048, spec.H = 0;
  spec.options.set_want_row_kl(true);
  spec.options.set_want_diagnostics(true);
  spec.options.set_recall_k(16);
  v1::ComputeLossRequest request = MakeRequest(spec);
  ShmObject object(2 << 20);
  ASSERT_TRUE(Register("r", object.key(), 0, object.byte_size()).ok());
  RegionLayout layout(object, "r");
  MoveAllIn(request, layout);
  const int64_t input_words = 2 * spec.T * spec.S;  // weights, then scores
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    const float values[] = {NAN,    INFINITY, -INFINITY, 3e38f,
                            -3e38f, 0.0f,     1e-45f,    -1.0f};
    auto* words = reinterpret_cast<float*>(object.data());
    uint64_t i = 0;
    while (!stop) {
      // A few words at a time, put back after a moment.
      int64_t at[16];
      float kept[16];
      for (int k = 0; k < 16; ++k, ++i) {
        at[k] = static_cast<int64_t>((i * 2654435761u) % input_words);
        kept[k] = words[at[k]];
        words[at[k]] = values[i % 8];
      }
      absl::SleepFor(absl::Microseconds(100));
      for (int k = 15; k >= 0; --k) words[at[k]] = kept[k];
      // Clean between times, so that many calls see no bad value in their
      // check and some see one appear after it.
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  int answered = 0, refused = 0;
  const absl::Time end = absl::Now() + absl::Seconds(6);
  while (absl::Now() < end) {
    for (const char* grad_dtype : {"FP32", "FP16"}) {
      request.mutable_options()->set_grad_dtype(grad_dtype);
      absl::StatusOr<v1::ComputeLossResponse> response =
          client().ComputeLossUnary(request);
      if (!response.ok()) {
        EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument)
            << Describe(response.status());
        refused += absl::StrContains(response.status().message(), "came out");
        continue;
      }
      ++answered;
      const v1::LossResult& result = response->result();
      EXPECT_TRUE(std::isfinite(result.loss()));
      EXPECT_TRUE(std::isfinite(result.unscaled_loss()));
      EXPECT_TRUE(std::isfinite(result.diagnostics().mean_entropy_p()));
      EXPECT_TRUE(std::isfinite(result.diagnostics().mean_entropy_q()));
      EXPECT_TRUE(std::isfinite(result.diagnostics().topk_recall()));
      for (const double g : DecodeFloats(response->grad())) {
        if (!std::isfinite(g)) {
          ADD_FAILURE() << grad_dtype << " gradient value " << g;
          break;
        }
      }
      for (const double kl : DecodeFloats(response->row_kl())) {
        if (!std::isfinite(kl)) {
          ADD_FAILURE() << "row KL " << kl;
          break;
        }
      }
    }
  }
  stop = true;
  vandal.join();
  RecordProperty("answered", answered);
  RecordProperty("refused_as_non_finite", refused);
  EXPECT_GT(answered, 0);
}

TEST_F(SharedMemoryTest, OffUnlessTheServerIsStartedWithIt) {
  StartServer();
  stub_ = MakeStub(server().target());
  ShmObject object(4096);
  ExpectCode(Register("r", object.key(), 0, 4096), grpc::UNIMPLEMENTED,
             "RegisterRegion:");
  grpc::ClientContext context;
  v1::ListRegionsResponse list;
  ExpectCode(stub_->ListRegions(&context, {}, &list), grpc::UNIMPLEMENTED,
             "ListRegions:");
  v1::ComputeLossRequest request = MakeRequest(SparseSpec());
  v1::RegionSlice& slice = *request.mutable_indexer_scores()->mutable_region();
  slice.set_region("r");
  slice.set_byte_size(request.indexer_scores().data().size());
  request.mutable_indexer_scores()->clear_data();
  ExpectCode(client().ComputeLossUnary(request).status(),
             absl::StatusCode::kFailedPrecondition, "indexer_scores.region:");
  absl::StatusOr<v1::GetServerInfoResponse> info = client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->shared_memory());
}

TEST_F(SharedMemoryTest, TheTokenGuardsTheRegionRpcs) {
  const std::string token_file =
      absl::StrCat(testing::TempDir(), "/shm-token-", getpid());
  std::ofstream(token_file) << "region-secret\n";
  ClientOptions security;
  security.auth_token = "region-secret";
  absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(
      {"--shared_memory", "--auth_token_file=" + token_file}, absl::Seconds(20),
      security);
  ASSERT_TRUE(started.ok()) << started.status();
  server_ = *std::move(started);
  client_ = MakeClient(server_->target(), 1, kCallDeadline, security);
  stub_ = MakeStub(server_->target());
  ShmObject object(4096);
  ExpectCode(Register("r", object.key(), 0, 4096), grpc::UNAUTHENTICATED, "");
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer region-secret");
  v1::RegisterRegionRequest request;
  request.set_name("r");
  request.set_key(object.key());
  request.set_byte_size(4096);
  v1::RegisterRegionResponse response;
  const grpc::Status with_token =
      stub_->RegisterRegion(&context, request, &response);
  EXPECT_TRUE(with_token.ok()) << Describe(with_token);
  unlink(token_file.c_str());
}

// This host's first non-loopback IPv4 address, or "" when it has none.
std::string OtherAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    if (!absl::StartsWith(text, "127.")) found = text;
  }
  freeifaddrs(list);
  return found;
}

// A caller reaching the server over a network address may not register: it
// cannot have made the object, and the server would write into it.
TEST_F(SharedMemoryTest, OnlyLocalCallersMayRegister) {
  const std::string address = OtherAddress();
  if (address.empty()) GTEST_SKIP() << "no non-loopback IPv4 address here";
  // The harness probes health on the socket; the network address is
  // served beside it.
  const std::string socket =
      absl::StrCat(testing::TempDir(), "/klserve-shm-", getpid(), ".sock");
  const int port = PickFreePort();
  absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(
      {"--shared_memory",
       absl::StrCat("--listen=unix:", socket, ",0.0.0.0:", port)},
      absl::Seconds(20), ClientOptions(),
      ListenOn{.loopback = false, .sockets = {socket}});
  ASSERT_TRUE(started.ok()) << started.status();
  server_ = *std::move(started);
  client_ = MakeClient(server_->target());
  stub_ = MakeStub(absl::StrCat(address, ":", port));
  ShmObject object(1 << 20);
  ExpectCode(Register("r", object.key(), 0, 4096), grpc::PERMISSION_DENIED,
             "RegisterRegion:");
  // Nor may it name a region a local job registered.
  stub_ = MakeStub(server_->target());
  ASSERT_TRUE(Register("r", object.key(), 0, 1 << 20).ok());
  v1::ComputeLossRequest request = MakeRequest(SparseSpec());
  RegionLayout layout(object, "r");
  MoveAllIn(request, layout);
  std::unique_ptr<Client> remote = MakeClient(absl::StrCat(address, ":", port));
  ExpectCode(remote->ComputeLossUnary(request).status(),
             absl::StatusCode::kPermissionDenied, "attention_logits.region:");
  EXPECT_TRUE(client().ComputeLossUnary(request).ok());
}

}  // namespace
}  // namespace klserve::integration
