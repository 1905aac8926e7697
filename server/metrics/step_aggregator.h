#ifndef KLSERVE_SERVER_METRICS_STEP_AGGREGATOR_H_
#define KLSERVE_SERVER_METRICS_STEP_AGGREGATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics/exact_sum.h"

namespace klserve::server {

// Per-step indexer loss, accumulated from the tagged requests of a training
// job (spec "Accumulation across a training step"). A step of a real job calls
// the loss once per layer, per microbatch, per data-parallel rank; each call is
// one StepSample. The value of a step is MaxText's `learning/indexer_loss`:
//
//   layer value  = sum of kl_sum / sum of rows over the step's samples of that
//                  layer (a row-weighted mean over microbatches and ranks;
//                  0 when the rows sum to 0, as a request with N = 0 is),
//   step loss    = c * mean over layers of the layer values.
//
// Samples without a layer tag form one implicit layer. The aggregator knows
// nothing of gRPC or Prometheus: the server feeds it from its RPC handlers and
// publishes what comes out (metrics, TensorBoard).

// Optional diagnostics of one request, as sums over its counted rows (the
// response's means times `rows_counted`).
struct SampleDiagnostics {
  double entropy_p_sum = 0.0;  // nats
  double entropy_q_sum = 0.0;  // nats
  // Absent when the request asked for no top-k recall (recall_k = 0).
  std::optional<double> recall_sum;
  int64_t rows_counted = 0;
};

// What one request contributes to its step.
struct StepSample {
  std::string run;  // required, non-empty
  int64_t step = 0;
  std::optional<int32_t> layer;
  int32_t microbatch = 0;
  // Sum over the request's counted rows of KL_t, before the coefficient.
  double kl_sum = 0.0;
  // The request's denominator N (B*T under MEAN, 1 under SUM, ...); >= 0.
  int64_t rows = 0;
  double scaling_factor = 1.0;  // the request's c
  std::optional<SampleDiagnostics> diagnostics;
};

// Why a step was finished.
enum class FinishReason {
  kNewerStep,   // a sample of a later step of the same run arrived
  kFinishStep,  // Finish(run, step), the FinishStep RPC
  kIdle,        // no sample for the step within the idle timeout
  kEvicted,     // the run was evicted to make room for a new run
  kShutdown,    // FinishAll, when the server drains
};

absl::string_view FinishReasonName(FinishReason reason);

// One layer's value in a finished step.
struct LayerLoss {
  std::optional<int32_t> layer;  // absent: the untagged samples
  double loss = 0.0;             // scaled by c
  double unscaled_loss = 0.0;
  int64_t rows = 0;
  int64_t samples = 0;
};

// A step whose samples are all in: what gets published.
struct FinishedStep {
  std::string run;  // as the samples sent it (not sanitized)
  int64_t step = 0;
  FinishReason reason = FinishReason::kNewerStep;
  // The step's indexer_loss: c * mean over layers (see the file comment).
  // When the samples of the step disagree on c, this is the mean over layers
  // of each layer's scaled value (sum of c_i * kl_sum_i / sum of rows) and
  // `scaling_factor` is absent.
  double loss = 0.0;
  double unscaled_loss = 0.0;  // mean over layers, before c
  // The c all the step's samples carried; absent when they differed.
  std::optional<double> scaling_factor;
  std::vector<LayerLoss> layers;  // ascending; the untagged layer first
  int64_t samples = 0;
  int64_t rows = 0;
  int64_t microbatches = 0;  // distinct microbatch tags seen
  // Means over the counted rows of the samples that carried diagnostics;
  // absent when none did (topk_recall: when none carried a recall).
  std::optional<double> mean_entropy_p;
  std::optional<double> mean_entropy_q;
  std::optional<double> topk_recall;
  absl::Time first_sample_time;
  absl::Time last_sample_time;
};

// A finished step's values as FinishStep answers them.
struct PublishedValues {
  double loss = 0.0;
  double unscaled_loss = 0.0;
  int64_t samples = 0;
};

// What one Add did. The caller publishes `finished` first, then removes the
// series of `evicted_runs` (whose pending steps are among `finished`).
struct AddResult {
  std::vector<FinishedStep> finished;
  std::vector<std::string> evicted_runs;
  // The sample was for a step already finished (older than the run's open
  // step, or at most its last finished step): counted, not merged.
  bool late = false;
  // With `late`: the run was evicted, and stays so. Taking it back would
  // evict a live run for a sample that publishes nothing; the sample is
  // counted where no run has series of its own.
  bool of_evicted_run = false;
};

struct StepAggregatorOptions {
  // Runs tracked at once. Each costs here about 1.7 KB and 1.1 KB a layer
  // of its open step (exact sums; 9 MB at 64 runs of 128 layers) and, in
  // Prometheus, about 4 series per layer, so this bounds the series count.
  int max_runs = 64;
  // A step with no new sample for this long is finished by FinishIdle. Longer
  // than the longest gap between two samples of one step (a slow step's
  // backward pass, a checkpoint write): splitting a step in two publishes two
  // wrong values, finishing it late only delays one.
  absl::Duration idle_timeout = absl::Minutes(5);
};

// Thread-safe (one mutex; every call is short: no I/O, no allocation beyond
// the step's state and the results).
//
// Each run has at most one open step. A sample of a later step finishes the
// open one; a sample of an earlier step, or of a step at most the run's last
// finished step, is late. An evicted run's last finished step is kept (for
// kEvictedRunsKeptPerRun * max_runs runs evicted last), so that a late sample
// of a run that comes back is late too rather than publishing a step again;
// only a sample of a later step takes the run back. A
// job resumed from an earlier checkpoint under the same run name therefore has
// its samples counted late until it passes the last step it reported; a resumed
// job should take a new run name.
class StepAggregator {
 public:
  // Evicted runs whose last finished step is kept, per tracked run: each is
  // its name (at most 128 bytes, kept at most three times: the map, and
  // evicted_order_ with up to twice as many entries as runs kept), its
  // published values and three integers, so 16 * max_runs of them stay
  // small.
  static constexpr int kEvictedRunsKeptPerRun = 16;

  explicit StepAggregator(StepAggregatorOptions options = {});

  StepAggregator(const StepAggregator&) = delete;
  StepAggregator& operator=(const StepAggregator&) = delete;

  // Adds a sample received at `now`. INVALID_ARGUMENT (naming the field) for
  // an empty run, negative rows or negative diagnostics rows; nothing changes
  // then. A NaN or infinite kl_sum is accepted and propagates into the step's
  // values, so that alerts on a non-finite loss fire.
  absl::StatusOr<AddResult> Add(const StepSample& sample, absl::Time now);

  // Finishes `step` of `run` now (all its samples were sent; the FinishStep
  // RPC) and returns it. ALREADY_EXISTS for a step already finished (by an
  // earlier Finish, a newer step or the idle timeout: every rank of a job may
  // call it), NOT_FOUND for a run with no samples (never seen, or evicted)
  // or a step with no samples yet, each with a message saying which;
  // nothing changes then.
  absl::StatusOr<FinishedStep> Finish(absl::string_view run, int64_t step);

  // The values `step` of `run` was published with, when it is the run's last
  // finished step (what another rank's Finish of it was answered), the run
  // tracked or evicted and still remembered; nullopt otherwise.
  std::optional<PublishedValues> LastPublished(absl::string_view run,
                                               int64_t step) const;

  // Finishes the open steps whose last sample is older than now minus the
  // idle timeout. Runs stay tracked (their series remain) until evicted.
  std::vector<FinishedStep> FinishIdle(absl::Time now);

  // Finishes every open step (on drain, before the final publish).
  std::vector<FinishedStep> FinishAll();

  // Runs tracked now.
  int num_runs() const;

 private:
  // The sums are exact (ExactSum), so that a step's values do not depend on
  // the order its samples arrived in.
  struct LayerSums {
    ExactSum kl_sum;
    ExactSum scaled_kl_sum;  // sum of c * kl_sum
    int64_t rows = 0;
    int64_t samples = 0;
  };

  struct OpenStep {
    int64_t step = 0;
    std::map<std::optional<int32_t>, LayerSums> layers;
    absl::flat_hash_set<int32_t> microbatches;
    double scaling_factor = 0.0;  // of the first sample
    bool mixed_scaling_factors = false;
    int64_t samples = 0;
    int64_t rows = 0;
    ExactSum entropy_p_sum;
    ExactSum entropy_q_sum;
    int64_t diagnostics_rows = 0;
    bool has_diagnostics = false;
    ExactSum recall_sum;
    int64_t recall_rows = 0;
    bool has_recall = false;
    absl::Time first_sample_time;
    absl::Time last_sample_time;
  };

  struct RunState {
    std::optional<OpenStep> open;
    std::optional<int64_t> last_finished_step;
    // The values of last_finished_step, for the ranks that finish it after
    // the first.
    PublishedValues last_values;
    absl::Time last_activity;
  };

  // Closes the run's open step (which must exist) into a FinishedStep.
  static FinishedStep Close(const std::string& run, RunState& state,
                            FinishReason reason);
  static void Merge(const StepSample& sample, absl::Time now, OpenStep& open);
  // Evicts the run whose last sample is oldest, appending its open step and
  // its name to `result`.
  void EvictOne(AddResult& result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StepAggregatorOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, RunState> runs_ ABSL_GUARDED_BY(mu_);
  // The last finished step of each run evicted since, by name with the
  // order of its eviction; evicted_order_ holds (name, order), oldest
  // first, and an entry whose order is no longer the name's is stale.
  struct EvictedRun {
    int64_t last_finished_step = 0;
    PublishedValues last_values;
    int64_t order = 0;
  };
  absl::flat_hash_map<std::string, EvictedRun> evicted_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, int64_t>> evicted_order_
      ABSL_GUARDED_BY(mu_);
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_STEP_AGGREGATOR_H_
