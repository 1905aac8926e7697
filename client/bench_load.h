#ifndef KLSERVE_CLIENT_BENCH_LOAD_H_
#define KLSERVE_CLIENT_BENCH_LOAD_H_

// klctl bench: bounded synthetic load on a klserve server, for the loss (its
// tensors inline or in a shared-memory region) and for the Echo transport
// baseline moving the same bytes.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/shared_memory_region.h"
#include "klserve/v1/klserve.pb.h"

namespace klserve {

// How ComputeLoss requests travel.
enum class StreamMode { kAuto, kAlways, kNever };

// The most bytes a synthetic problem's inputs may take: a quarter of the
// memory this process may use, its container's limit where that is lower
// than the machine's memory (the bench holds the inputs, a message of them
// per request in flight and the gradients that come back).
int64_t MaxSyntheticInputBytes();

// The synthetic problem: dense (topk == 0) or sparse, per-head logits
// (heads > 0) or a head-aggregated target (heads == 0).
struct SyntheticProblem {
  int64_t batch = 1;                // B
  int64_t rows = 4096;              // T
  int64_t keys = 4096;              // S
  int64_t heads = 0;                // H; 0: attention_weights instead of logits
  int64_t topk = 0;                 // K; 0: dense stage
  std::string dtype = "FP32";       // of the float inputs
  std::string grad_dtype = "FP32";  // asked of the server
};

// Random valid inputs for `problem`: logits and scores uniform in [-4, 4),
// weights uniform in (0, 1] (positive, so no row has a zero target), top-k
// indices distinct per row. The gradient is requested, row_kl and
// diagnostics are not. INVALID_ARGUMENT for non-positive sizes, topk > keys,
// an unknown dtype or inputs past MaxSyntheticInputBytes().
absl::StatusOr<v1::ComputeLossRequest> MakeSyntheticRequest(
    const SyntheticProblem& problem);

// The synthetic problem of the projections form: the main attention's q
// and k and the indexer's q_I, k_I and head weights, causal, dense
// (topk == 0) or with the service's own top-k selection.
struct SyntheticProjections {
  int64_t batch = 1;        // B
  int64_t rows = 4096;      // T
  int64_t keys = 4096;      // S
  int64_t heads = 16;       // H
  int64_t kv_heads = 16;    // H_kv, dividing H
  int64_t head_dim = 128;   // D
  int64_t index_heads = 8;  // H_I
  int64_t index_dim = 64;   // D_I
  int64_t topk = 0;         // K of the service's selection; 0: dense
  std::string dtype = "FP32";
  std::string grad_dtype = "FP32";
};

// Random valid inputs for `problem`: every projection uniform in [-1, 1),
// softmax_scale D^-1/2. The gradients are requested, row_kl and diagnostics
// are not. INVALID_ARGUMENT for non-positive sizes, kv_heads not dividing
// heads, topk < 0, an unknown dtype or inputs past MaxSyntheticInputBytes().
absl::StatusOr<v1::ComputeLossRequest> MakeSyntheticProjectionsRequest(
    const SyntheticProjections& problem);

// The Echo messages that move exactly the tensor bytes a ComputeLoss of
// `request` moves, in the same pieces: one message (request bytes up,
// gradient bytes down) when it goes unary, otherwise one per row block
// (block bytes up, with the header's small tensors in the first; that
// block's gradient bytes down). `grad_element_bytes` is the gradient dtype's
// size. Follows `client_options` for the threshold and block size. A
// projections-form request goes unary: one message, its three gradients'
// bytes down.
absl::StatusOr<std::vector<EchoMessageSize>> EchoPlanFor(
    const v1::ComputeLossRequest& request, int64_t grad_element_bytes,
    StreamMode mode, const ClientOptions& client_options);

// Whether a ComputeLoss of `request` goes through the stream under `mode`.
bool UsesStream(const v1::ComputeLossRequest& request, StreamMode mode,
                const ClientOptions& client_options);

struct LoadLimits {
  int concurrency = 1;                          // workers, each its own Client
  absl::Duration duration = absl::Seconds(10);  // no request starts after it
  int64_t count = 0;                            // total requests; 0: no limit
};

// What one bench phase measured.
struct LoadResult {
  int64_t requests = 0;  // completed
  // Calls the server refused for lack of a slot (RESOURCE_EXHAUSTED at its
  // --max_concurrent_requests or --max_open_streams): sent again after a
  // short pause, not counted as requests.
  int64_t refusals = 0;
  int64_t bytes = 0;                 // tensor/payload bytes, both ways
  absl::Duration elapsed;            // first start to last completion
  std::vector<double> latencies_ms;  // per request, sorted
  absl::Status first_error;          // the first failure; it stops the phase

  double RequestsPerSecond() const;
  double GigabytesPerSecond() const;                  // 1e9 bytes
  double LatencyPercentileMs(double fraction) const;  // nearest rank
};

// Runs `call(worker)` (one request of worker 0 .. limits.concurrency - 1;
// returns the bytes it moved) from `limits.concurrency` threads until
// `limits` stop it or a call fails; a slot refusal is retried. The other
// Run*Load functions are this with a call each.
LoadResult RunWorkers(
    const LoadLimits& limits,
    absl::FunctionRef<absl::StatusOr<int64_t>(int worker)> call);

// A problem placed in one shared-memory region: its tensors' bytes copied in
// once, and, for each worker, its own slices for the outputs the problem
// asks for (the gradient or the projections form's three, row_kl, the
// service's top-k), so that concurrent calls never write the same bytes.
// Slices start at multiples of 64 bytes.
struct RegionProblem {
  SharedMemoryRegion region;
  // The region's name on the server: its key, unique to this process.
  std::string name;
  // requests[w]: the problem with every tensor a slice of the region and
  // `outputs` set to worker w's slices.
  std::vector<v1::ComputeLossRequest> requests;
  // What one call moves through the region, counted as the inline call's
  // bytes are: the input tensors and the gradients.
  int64_t bytes_per_call = 0;
};

// Places `request` (every tensor inline) for `workers` workers.
absl::StatusOr<RegionProblem> PlaceInRegion(
    const v1::ComputeLossRequest& request, int workers);

// Runs the unary ComputeLoss of `problem.requests[w]` from worker w, as
// RunLossLoad does; `problem` must be registered under problem.name. A
// response returning a requested output inline rather than in its slice is
// an error.
LoadResult RunRegionLossLoad(const RegionProblem& problem,
                             const ClientOptions& client_options,
                             const LoadLimits& limits);

// Runs ComputeLoss of `request` (by `mode`) from `limits.concurrency`
// threads until `limits` stop it or a call fails. Counts request tensor
// bytes plus returned gradient bytes (the projections form's three).
LoadResult RunLossLoad(const v1::ComputeLossRequest& request, StreamMode mode,
                       const ClientOptions& client_options,
                       const LoadLimits& limits);

// Runs Echo streams of `plan` under the same rules; counts payload bytes
// both ways.
LoadResult RunEchoLoad(const std::vector<EchoMessageSize>& plan,
                       const ClientOptions& client_options,
                       const LoadLimits& limits);

}  // namespace klserve

#endif  // KLSERVE_CLIENT_BENCH_LOAD_H_
