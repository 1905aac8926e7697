#include "client/bench_load.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/call_status.h"
#include "client/stream_codec.h"
#include "client/tensor_util.h"
#include "kernels/cpu/usable_memory.h"
#include "kernels/half.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"

namespace klserve {
namespace {

// splitmix64: fast and good enough for synthetic data (a 16M-element
// tensor takes tens of milliseconds).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  float Unit() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

// A float tensor of `shape` in `dtype` with elements from `next()`.
template <typename Next>
v1::Tensor FloatTensor(const std::string& dtype, std::vector<int64_t> shape,
                       Next next) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  std::string* data = tensor.mutable_data();
  if (dtype == "FP32") {
    data->resize(count * sizeof(float));
    auto* out = reinterpret_cast<float*>(data->data());
    for (int64_t i = 0; i < count; ++i) out[i] = next();
  } else {
    data->resize(count * sizeof(uint16_t));
    auto* out = reinterpret_cast<uint16_t*>(data->data());
    const bool bf16 = dtype == "BF16";
    for (int64_t i = 0; i < count; ++i) {
      const float value = next();
      out[i] = bf16 ? FloatToBFloat16(value) : FloatToFloat16(value);
    }
  }
  return tensor;
}

// INVALID_ARGUMENT when the inputs of `problem`, each a dtype and a shape,
// would take more than MaxSyntheticInputBytes(): checked before any is made,
// as making them would end klctl in std::bad_alloc or the OOM killer.
absl::Status CheckInputBytes(
    absl::string_view problem,
    std::initializer_list<std::pair<absl::string_view, std::vector<int64_t>>>
        inputs) {
  int64_t total = 0;
  bool overflow = false;
  for (const auto& [dtype, shape] : inputs) {
    const absl::StatusOr<int64_t> bytes = ExpectedTensorBytes(dtype, shape);
    overflow = overflow || !bytes.ok() ||
               __builtin_add_overflow(total, *bytes, &total);
  }
  const int64_t bound = MaxSyntheticInputBytes();
  if (!overflow && total <= bound) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "bench problem: the inputs of ", problem, " would take ",
      overflow ? "more than 2^63" : absl::StrCat(total),
      " bytes, past the bound of ", bound,
      " bytes (a quarter of the memory this process may use: the machine's, "
      "or its container's limit); make --shape smaller"));
}

// A Client that has answered GetServerInfo: connected.
absl::StatusOr<std::unique_ptr<Client>> ConnectedClient(
    const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(options));
  RETURN_IF_ERROR(client->GetServerInfo().status());
  return client;
}

// Runs `call(client, worker)` (one request on a Client; returns the bytes
// it moved) from `limits.concurrency` workers, each on its own connected
// Client.
template <typename Call>
LoadResult RunLoad(const ClientOptions& client_options,
                   const LoadLimits& limits, Call call) {
  LoadResult failed;
  // A server that is starting is waited for, as every klctl command does.
  failed.first_error = ConnectedClient(client_options).status();
  if (!failed.first_error.ok()) return failed;
  // Then RunWorkers sends a refused request again itself, at once: the
  // client's backoff would be measured as latency.
  ClientOptions once = client_options;
  once.max_attempts = 1;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < limits.concurrency; ++i) {
    // Connected before the clock starts, so that the first request's
    // latency is not a TCP handshake.
    absl::StatusOr<std::unique_ptr<Client>> client = ConnectedClient(once);
    if (!client.ok()) {
      failed.first_error = client.status();
      return failed;
    }
    clients.push_back(*std::move(client));
  }
  return RunWorkers(limits,
                    [&](int worker) { return call(*clients[worker], worker); });
}

}  // namespace

int64_t MaxSyntheticInputBytes() {
  const std::optional<int64_t> memory = cpu::UsableMemoryBytes();
  if (!memory) return std::numeric_limits<int64_t>::max();  // unknown
  return *memory / 4;
}

LoadResult RunWorkers(
    const LoadLimits& limits,
    absl::FunctionRef<absl::StatusOr<int64_t>(int worker)> call) {
  LoadResult result;
  std::atomic<int64_t> started{0};
  std::atomic<int64_t> refusals{0};
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  const absl::Time start = absl::Now();
  const absl::Time end = start + limits.duration;
  std::vector<std::thread> workers;
  for (int worker = 0; worker < limits.concurrency; ++worker) {
    workers.emplace_back([&, worker] {
      std::vector<double> latencies;
      int64_t bytes = 0;
      absl::Status error;
      while (!stop.load(std::memory_order_relaxed) && absl::Now() < end) {
        if (limits.count > 0 && started.fetch_add(1) >= limits.count) break;
        const absl::Time begin = absl::Now();
        absl::StatusOr<int64_t> moved = call(worker);
        // More workers than the server's slots: a refusal is the server's
        // answer to load, not a failure of the benchmark; the request is
        // sent again (its latency includes the wait).
        while (IsOverloaded(moved.status()) && absl::Now() < end) {
          refusals.fetch_add(1);
          absl::SleepFor(absl::Milliseconds(1));
          moved = call(worker);
        }
        if (IsOverloaded(moved.status())) break;  // out of time
        if (!moved.ok()) {
          error = moved.status();
          stop = true;
          break;
        }
        latencies.push_back(absl::ToDoubleMilliseconds(absl::Now() - begin));
        bytes += *moved;
      }
      absl::MutexLock lock(&mu);
      result.latencies_ms.insert(result.latencies_ms.end(), latencies.begin(),
                                 latencies.end());
      result.bytes += bytes;
      if (!error.ok() && result.first_error.ok()) result.first_error = error;
    });
  }
  for (std::thread& worker : workers) worker.join();
  result.elapsed = absl::Now() - start;
  result.refusals = refusals.load();
  std::sort(result.latencies_ms.begin(), result.latencies_ms.end());
  result.requests = result.latencies_ms.size();
  return result;
}

absl::StatusOr<v1::ComputeLossRequest> MakeSyntheticRequest(
    const SyntheticProblem& problem) {
  if (problem.batch < 1 || problem.rows < 1 || problem.keys < 1 ||
      problem.heads < 0 || problem.topk < 0 || problem.topk > problem.keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench problem: need B, T, S >= 1, heads >= 0 and 0 <= topk <= S, got "
        "B=",
        problem.batch, " T=", problem.rows, " S=", problem.keys,
        " heads=", problem.heads, " topk=", problem.topk));
  }
  if (problem.dtype != "FP32" && problem.dtype != "BF16" &&
      problem.dtype != "FP16") {
    return absl::InvalidArgumentError(
        absl::StrCat("bench problem: dtype must be FP32, BF16 or FP16, got ",
                     problem.dtype));
  }
  const int64_t B = problem.batch, T = problem.rows, S = problem.keys;
  const int64_t H = problem.heads, K = problem.topk;
  const int64_t width = K > 0 ? K : S;
  const std::vector<int64_t> target_shape =
      H > 0 ? std::vector<int64_t>{B, H, T, width}
            : std::vector<int64_t>{B, T, width};
  const std::vector<int64_t> scores_shape = {B, T, width};
  RETURN_IF_ERROR(
      CheckInputBytes(absl::StrCat("B=", B, " T=", T, " S=", S, " heads=", H,
                                   " topk=", K, " ", problem.dtype),
                      {{problem.dtype, target_shape},
                       {problem.dtype, scores_shape},
                       {"INT32", {B, T, K}}}));

  v1::ComputeLossRequest request;
  request.set_request_id("klctl-bench");
  v1::LossOptions* options = request.mutable_options();
  options->set_num_keys(S);
  options->set_grad_dtype(problem.grad_dtype);

  Rng rng(0x6b6c7365727665ull);
  const auto logit = [&rng] { return rng.Unit() * 8.0f - 4.0f; };
  if (H > 0) {
    *request.mutable_attention_logits() =
        FloatTensor(problem.dtype, target_shape, logit);
  } else {
    // 1 - [0, 1) is (0, 1]: every weight positive.
    *request.mutable_attention_weights() = FloatTensor(
        problem.dtype, target_shape, [&rng] { return 1.0f - rng.Unit(); });
  }
  *request.mutable_indexer_scores() =
      FloatTensor(problem.dtype, scores_shape, logit);

  if (K > 0) {
    // A partial Fisher-Yates shuffle per row over one running permutation:
    // K distinct keys per row in O(K).
    std::vector<int32_t> keys(S);
    std::iota(keys.begin(), keys.end(), 0);
    v1::Tensor* topk = request.mutable_topk_indices();
    topk->set_dtype("INT32");
    for (int64_t dim : {B, T, K}) topk->add_shape(dim);
    std::string* data = topk->mutable_data();
    data->resize(B * T * K * sizeof(int32_t));
    auto* out = reinterpret_cast<int32_t*>(data->data());
    for (int64_t row = 0; row < B * T; ++row) {
      for (int64_t j = 0; j < K; ++j) {
        std::swap(keys[j], keys[j + rng.Next() % (S - j)]);
        out[row * K + j] = keys[j];
      }
    }
  }
  return request;
}

absl::StatusOr<v1::ComputeLossRequest> MakeSyntheticProjectionsRequest(
    const SyntheticProjections& p) {
  if (p.batch < 1 || p.rows < 1 || p.keys < 1 || p.heads < 1 ||
      p.kv_heads < 1 || p.heads % p.kv_heads != 0 || p.head_dim < 1 ||
      p.index_heads < 1 || p.index_dim < 1 || p.topk < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench problem: need B, T, S, H, D, H_I, D_I >= 1, H_kv dividing H "
        "and topk >= 0, got B=",
        p.batch, " T=", p.rows, " S=", p.keys, " H=", p.heads,
        " H_kv=", p.kv_heads, " D=", p.head_dim, " H_I=", p.index_heads,
        " D_I=", p.index_dim, " topk=", p.topk));
  }
  if (p.dtype != "FP32" && p.dtype != "BF16" && p.dtype != "FP16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench problem: dtype must be FP32, BF16 or FP16, got ", p.dtype));
  }
  const int64_t B = p.batch, T = p.rows, S = p.keys;
  const std::vector<int64_t> query_shape = {B, T, p.heads, p.head_dim};
  const std::vector<int64_t> key_shape = {B, S, p.kv_heads, p.head_dim};
  const std::vector<int64_t> index_query_shape = {B, T, p.index_heads,
                                                  p.index_dim};
  const std::vector<int64_t> index_key_shape = {B, S, p.index_dim};
  const std::vector<int64_t> index_weights_shape = {B, T, p.index_heads};
  RETURN_IF_ERROR(CheckInputBytes(
      absl::StrCat("B=", B, " T=", T, " S=", S, " H=", p.heads,
                   " H_kv=", p.kv_heads, " D=", p.head_dim,
                   " H_I=", p.index_heads, " D_I=", p.index_dim, " ", p.dtype),
      {{p.dtype, query_shape},
       {p.dtype, key_shape},
       {p.dtype, index_query_shape},
       {p.dtype, index_key_shape},
       {p.dtype, index_weights_shape}}));

  v1::ComputeLossRequest request;
  request.set_request_id("klctl-bench-projections");
  v1::LossOptions* options = request.mutable_options();
  options->set_causal(true);
  options->set_softmax_scale(
      static_cast<float>(1 / std::sqrt(static_cast<double>(p.head_dim))));
  options->set_topk(p.topk);
  options->set_grad_dtype(p.grad_dtype);

  Rng rng(0x70726f6a656374ull);
  const auto value = [&rng] { return rng.Unit() * 2.0f - 1.0f; };
  *request.mutable_query() = FloatTensor(p.dtype, query_shape, value);
  *request.mutable_key() = FloatTensor(p.dtype, key_shape, value);
  *request.mutable_index_query() =
      FloatTensor(p.dtype, index_query_shape, value);
  *request.mutable_index_key() = FloatTensor(p.dtype, index_key_shape, value);
  *request.mutable_index_weights() =
      FloatTensor(p.dtype, index_weights_shape, value);
  return request;
}

bool UsesStream(const v1::ComputeLossRequest& request, StreamMode mode,
                const ClientOptions& client_options) {
  switch (mode) {
    case StreamMode::kAlways:
      return true;
    case StreamMode::kNever:
      return false;
    case StreamMode::kAuto:
      break;
  }
  return StreamCarries(request) &&
         RequestTensorBytes(request) > client_options.stream_threshold_bytes;
}

absl::StatusOr<std::vector<EchoMessageSize>> EchoPlanFor(
    const v1::ComputeLossRequest& request, int64_t grad_element_bytes,
    StreamMode mode, const ClientOptions& client_options) {
  ASSIGN_OR_RETURN(const RequestSlicer slicer, RequestSlicer::Create(request));
  int64_t grad_row_bytes = slicer.row_width() * grad_element_bytes;
  // Bytes the last message carries beyond the rows': d_index_key.
  int64_t end_bytes = 0;
  if (slicer.form() == RequestForm::kProjections) {
    // d_index_query and d_index_weights per query row, d_index_key per key.
    const auto& q = request.index_query().shape();
    const auto& k = request.index_key().shape();
    if (q.size() != 4 || k.size() != 3) {
      return absl::InvalidArgumentError(
          "index_query, index_key: must be [B, T, H_I, D_I] and [B, S, D_I]");
    }
    grad_row_bytes = (q[2] * q[3] + q[2]) * grad_element_bytes;
    end_bytes = k[0] * k[1] * k[2] * grad_element_bytes;
  }
  const int64_t request_bytes = RequestTensorBytes(request);
  if (!UsesStream(request, mode, client_options)) {
    return std::vector<EchoMessageSize>{
        {request_bytes, slicer.num_rows() * grad_row_bytes + end_bytes}};
  }
  const int64_t block_rows = slicer.BlockRowsFor(client_options.block_bytes);
  // What the header carries whole: everything but the per-row tensors.
  int64_t header_bytes = request_bytes - slicer.num_rows() * slicer.row_bytes();
  std::vector<EchoMessageSize> plan;
  // As the stream: a counting pass first when it needs one, answered
  // without a gradient.
  for (const bool counting : {true, false}) {
    if (counting && !slicer.counts_first()) continue;
    for (int64_t row = 0; row < slicer.num_rows(); row += block_rows) {
      const int64_t n = std::min(block_rows, slicer.num_rows() - row);
      plan.push_back({n * slicer.row_bytes() + header_bytes,
                      counting ? 0 : n * grad_row_bytes});
      header_bytes = 0;
    }
  }
  plan.back().reply_bytes += end_bytes;
  return plan;
}

namespace {

// An output of ComputeLoss that can go to a region: its slice in
// OutputRegions and its tensor in the response.
struct OutputField {
  const char* name;
  v1::RegionSlice* (v1::OutputRegions::*mutable_slice)();
  bool (v1::OutputRegions::*has_slice)() const;
  const v1::Tensor& (v1::ComputeLossResponse::*tensor)() const;
  bool gradient;  // counted in a call's bytes, as the inline bench does
};

constexpr OutputField kGrad = {"grad", &v1::OutputRegions::mutable_grad,
                               &v1::OutputRegions::has_grad,
                               &v1::ComputeLossResponse::grad, true};
constexpr OutputField kRowKl = {"row_kl", &v1::OutputRegions::mutable_row_kl,
                                &v1::OutputRegions::has_row_kl,
                                &v1::ComputeLossResponse::row_kl, false};
constexpr OutputField kDIndexQuery = {
    "d_index_query", &v1::OutputRegions::mutable_d_index_query,
    &v1::OutputRegions::has_d_index_query,
    &v1::ComputeLossResponse::d_index_query, true};
constexpr OutputField kDIndexKey = {
    "d_index_key", &v1::OutputRegions::mutable_d_index_key,
    &v1::OutputRegions::has_d_index_key, &v1::ComputeLossResponse::d_index_key,
    true};
constexpr OutputField kDIndexWeights = {
    "d_index_weights", &v1::OutputRegions::mutable_d_index_weights,
    &v1::OutputRegions::has_d_index_weights,
    &v1::ComputeLossResponse::d_index_weights, true};
constexpr OutputField kTopkIndices = {
    "topk_indices", &v1::OutputRegions::mutable_topk_indices,
    &v1::OutputRegions::has_topk_indices,
    &v1::ComputeLossResponse::topk_indices, false};
constexpr const OutputField* kOutputFields[] = {&kGrad,          &kRowKl,
                                                &kDIndexQuery,   &kDIndexKey,
                                                &kDIndexWeights, &kTopkIndices};

// An output `request` asks for: the field, its dtype and shape.
struct WantedOutput {
  const OutputField* field;
  std::string dtype;
  std::vector<int64_t> shape;
};

std::vector<int64_t> ShapeOf(const v1::Tensor& tensor) {
  return {tensor.shape().begin(), tensor.shape().end()};
}

// The outputs a ComputeLoss of `request` produces, as the proto documents
// them.
absl::StatusOr<std::vector<WantedOutput>> WantedOutputs(
    const v1::ComputeLossRequest& request) {
  const v1::LossOptions& options = request.options();
  const std::string grad_dtype =
      options.grad_dtype().empty() ? "FP32" : options.grad_dtype();
  const bool projections = request.has_query();
  // [B, T, ...]: the scores in the logits forms, the indexer's queries in
  // the projections form.
  const v1::Tensor& rows =
      projections ? request.index_query() : request.indexer_scores();
  if (rows.shape_size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(projections ? "index_query" : "indexer_scores",
                     ": needs at least two dimensions [B, T, ...]"));
  }
  const int64_t B = rows.shape(0), T = rows.shape(1);
  std::vector<WantedOutput> wanted;
  if (!options.skip_grad()) {
    if (projections) {
      wanted.push_back(
          {&kDIndexQuery, grad_dtype, ShapeOf(request.index_query())});
      wanted.push_back({&kDIndexKey, grad_dtype, ShapeOf(request.index_key())});
      wanted.push_back(
          {&kDIndexWeights, grad_dtype, ShapeOf(request.index_weights())});
    } else {
      wanted.push_back({&kGrad, grad_dtype, ShapeOf(request.indexer_scores())});
    }
  }
  if (options.want_row_kl()) {
    wanted.push_back({&kRowKl, "FP64", {B, T}});
  }
  if (projections && options.topk() > 0) {
    wanted.push_back({&kTopkIndices, "INT32", {B, T, options.topk()}});
  }
  return wanted;
}

// Offsets 64 bytes apart: a multiple of every element size, and no two
// slices share a cache line.
int64_t Align(int64_t offset) { return (offset + 63) / 64 * 64; }

}  // namespace

absl::StatusOr<RegionProblem> PlaceInRegion(
    const v1::ComputeLossRequest& request, int workers) {
  if (workers < 1) {
    return absl::InvalidArgumentError("PlaceInRegion: workers must be >= 1");
  }
  RETURN_IF_ERROR(CheckNoRegions(request));
  ASSIGN_OR_RETURN(const std::vector<WantedOutput> wanted,
                   WantedOutputs(request));
  // The layout first: the inputs, then each worker's outputs.
  int64_t size = 0;
  std::vector<int64_t> input_offsets;
  for (const RequestTensor& tensor : kRequestTensors) {
    const v1::Tensor* t = FindTensor(request, tensor);
    if (t == nullptr) continue;
    RETURN_IF_ERROR(CheckTensorBytes(tensor.name, *t));
    size = Align(size);
    input_offsets.push_back(size);
    size += static_cast<int64_t>(t->data().size());
  }
  int64_t gradient_bytes = 0;
  std::vector<std::vector<int64_t>> output_offsets(workers);
  for (int w = 0; w < workers; ++w) {
    for (const WantedOutput& output : wanted) {
      ASSIGN_OR_RETURN(const int64_t bytes,
                       ExpectedTensorBytes(output.dtype, output.shape));
      size = Align(size);
      output_offsets[w].push_back(size);
      size += bytes;
      if (w == 0 && output.field->gradient) gradient_bytes += bytes;
    }
  }

  ASSIGN_OR_RETURN(SharedMemoryRegion region,
                   SharedMemoryRegion::Create(std::max<int64_t>(size, 1)));
  std::string name = region.key();
  RegionProblem problem{
      .region = std::move(region),
      .name = std::move(name),
      .requests = {},
      .bytes_per_call = RequestTensorBytes(request) + gradient_bytes};

  v1::ComputeLossRequest placed = request;
  size_t input = 0;
  for (const RequestTensor& tensor : kRequestTensors) {
    v1::Tensor* t = FindTensor(request, tensor) == nullptr
                        ? nullptr
                        : MutableTensor(placed, tensor);
    if (t == nullptr) continue;
    const int64_t offset = input_offsets[input++];
    std::memcpy(problem.region.data() + offset, t->data().data(),
                t->data().size());
    ASSIGN_OR_RETURN(
        *t, RegionTensor(t->dtype(), ShapeOf(*t), problem.name, offset));
  }
  for (int w = 0; w < workers; ++w) {
    v1::ComputeLossRequest& mine = problem.requests.emplace_back(placed);
    for (size_t i = 0; i < wanted.size(); ++i) {
      ASSIGN_OR_RETURN(
          *(mine.mutable_outputs()->*wanted[i].field->mutable_slice)(),
          RegionSliceFor(wanted[i].dtype, wanted[i].shape, problem.name,
                         output_offsets[w][i]));
    }
  }
  return problem;
}

LoadResult RunRegionLossLoad(const RegionProblem& problem,
                             const ClientOptions& client_options,
                             const LoadLimits& limits) {
  if (static_cast<int>(problem.requests.size()) < limits.concurrency) {
    LoadResult result;
    result.first_error = absl::InvalidArgumentError(absl::StrCat(
        "RunRegionLossLoad: the region holds outputs for ",
        problem.requests.size(), " workers, not ", limits.concurrency));
    return result;
  }
  return RunLoad(client_options, limits,
                 [&](Client& client, int worker) -> absl::StatusOr<int64_t> {
                   const v1::ComputeLossRequest& request =
                       problem.requests[worker];
                   ASSIGN_OR_RETURN(const v1::ComputeLossResponse response,
                                    client.ComputeLossUnary(request));
                   for (const OutputField* field : kOutputFields) {
                     if (!(request.outputs().*field->has_slice)()) continue;
                     const v1::Tensor& tensor = (response.*field->tensor)();
                     if (!tensor.has_region() || !tensor.data().empty()) {
                       return absl::InternalError(absl::StrCat(
                           "server broke the protocol: ComputeLoss returned ",
                           field->name, " inline, not in its region slice"));
                     }
                   }
                   return problem.bytes_per_call;
                 });
}

double LoadResult::RequestsPerSecond() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? requests / seconds : 0.0;
}

double LoadResult::GigabytesPerSecond() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

double LoadResult::LatencyPercentileMs(double fraction) const {
  if (latencies_ms.empty()) return 0.0;
  const auto rank = static_cast<int64_t>(
      std::ceil(fraction * static_cast<double>(latencies_ms.size())));
  return latencies_ms[std::clamp<int64_t>(rank - 1, 0,
                                          latencies_ms.size() - 1)];
}

LoadResult RunLossLoad(const v1::ComputeLossRequest& request, StreamMode mode,
                       const ClientOptions& client_options,
                       const LoadLimits& limits) {
  const int64_t request_bytes = RequestTensorBytes(request);
  return RunLoad(
      client_options, limits,
      [&](Client& client, int) -> absl::StatusOr<int64_t> {
        absl::StatusOr<v1::ComputeLossResponse> response;
        switch (mode) {
          case StreamMode::kAuto:
            response = client.ComputeLoss(request);
            break;
          case StreamMode::kAlways:
            response = client.ComputeLossStreaming(request);
            break;
          case StreamMode::kNever:
            response = client.ComputeLossUnary(request);
            break;
        }
        if (!response.ok()) return response.status();
        int64_t grad_bytes = 0;
        for (const v1::Tensor* grad :
             {&response->grad(), &response->d_index_query(),
              &response->d_index_key(), &response->d_index_weights()}) {
          grad_bytes += static_cast<int64_t>(grad->data().size());
        }
        return request_bytes + grad_bytes;
      });
}

LoadResult RunEchoLoad(const std::vector<EchoMessageSize>& plan,
                       const ClientOptions& client_options,
                       const LoadLimits& limits) {
  return RunLoad(client_options, limits,
                 [&](Client& client, int) -> absl::StatusOr<int64_t> {
                   ASSIGN_OR_RETURN(const EchoStats stats,
                                    client.EchoStream(plan));
                   return stats.bytes_sent + stats.bytes_received;
                 });
}

}  // namespace klserve
