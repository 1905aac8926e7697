#ifndef KLSERVE_SERVER_METRICS_LOSS_REPORTER_H_
#define KLSERVE_SERVER_METRICS_LOSS_REPORTER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/loss.h"
#include "server/metrics/loss_tags.h"
#include "server/metrics/metrics.h"
#include "server/metrics/step_aggregator.h"
#include "server/tensorboard/tensorboard_writer.h"

namespace klserve::server {

struct LossReporterOptions {
  StepAggregatorOptions steps;
  // tags.layer must be in [0, max_layers_per_run). Each layer of a run adds
  // 4 Prometheus series for as long as the run is tracked, so this, with
  // max_runs, bounds the series a caller can create. A range rather than a
  // count of distinct layers: it is checked on the request alone, before
  // computing, with no state and no race between concurrent requests of a
  // run; layers are numbered 0..L-1 in practice (DeepSeek-V3: 61).
  int max_layers_per_run = 128;
  // tags.microbatch must be in [0, max_microbatches_per_step). A step keeps
  // the set of its distinct microbatches until it is published (its count
  // is klserve_indexer_microbatches), and a step kept open by a steady
  // stream of requests would otherwise grow it without end (400,000 ids
  // took 24 MB). A range for the reasons given for layers; a job numbering
  // its microbatches globally (rank * per_rank + i) needs ranks times its
  // per-rank count.
  int max_microbatches_per_step = 65536;
  // Where each run's TensorBoard event file goes; empty writes none.
  std::string tensorboard_dir;
  // Runs given a TensorBoard directory in this process's lifetime. A run
  // past the bound still gets its Prometheus series but no event file (see
  // WriteTensorBoard). Directories are never deleted: they hold
  // researchers' data, and a run evicted from the aggregator writes a new
  // event file into its own directory when it comes back.
  int max_tensorboard_runs = 1024;
  // Disk space the event files in tensorboard_dir may take, all runs
  // together: those found there at start (each in whole kEventFileCharge
  // blocks, and a block for each directory: a restarted server's earlier
  // files), then every record framed, plus kEventFileCharge for each file
  // opened (a run evicted from the aggregator opens a new file when it
  // returns) and for each directory a new run's name makes (a new run whose
  // directories would pass the bound gets none). Once it is spent, steps
  // reach Prometheus only (see WriteTensorBoard); the step that spends it
  // is written whole, so the files may pass it by one step's records.
  // Without it a caller publishing steps as fast as it can would fill the
  // disk.
  int64_t max_tensorboard_bytes = int64_t{16} << 30;
  // How often idle steps are finished and event files flushed.
  absl::Duration tick = absl::Seconds(1);
};

// Turns tagged requests into per-step losses: accumulates them by run, step
// and layer (StepAggregator), and publishes each finished step to
// Prometheus (Metrics) and to the run's TensorBoard event file. A background
// thread finishes idle steps and flushes the files. A TensorBoard write
// failure is logged and counted, never returned to the RPC. Thread-safe.
class LossReporter {
 public:
  // What opening an event file counts against max_tensorboard_bytes: the
  // block a file takes on disk, however little it holds.
  static constexpr int64_t kEventFileCharge = 4096;

  LossReporter(Metrics* metrics, LossReporterOptions options);
  // Stops the background thread and publishes what is still open.
  ~LossReporter();

  // Checked before a request computes, so that a refused request is counted
  // nowhere. For a tagged request (run set): INVALID_ARGUMENT, naming the
  // field, for a run name CheckRunName refuses, a missing step, or a layer
  // outside [0, max_layers_per_run), or a microbatch outside [0,
  // max_microbatches_per_step). Untagged requests are not aggregated,
  // so their step and layer are not checked.
  absl::Status CheckTags(const LossTags& tags) const;

  // A request's loss. Untagged requests (no run) are not aggregated.
  absl::Status Add(const LossTags& tags, const IndexerKlResult& result,
                   double scaling_factor);

  // The FinishStep RPC: publishes the run's open step now. INVALID_ARGUMENT
  // (naming `run`) for a run name CheckRunName refuses.
  absl::StatusOr<FinishedStep> FinishStep(absl::string_view run, int64_t step);

  // Publishes every open step and flushes and closes the event files (on
  // drain). Idempotent.
  void Shutdown();

 private:
  void Publish(const std::vector<FinishedStep>& steps);
  void WriteTensorBoard(const FinishedStep& step);
  // Whether `run` may have a TensorBoard directory: it has one already, or
  // fewer than max_tensorboard_runs runs do (it then takes one).
  bool TakeTensorBoardRun(const std::string& run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether max_tensorboard_bytes has room left, `needed` bytes more than
  // it holds; logs once when it has not.
  bool TensorBoardBytesLeft(const std::string& run, int64_t needed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Tick();

  Metrics* const metrics_;
  const LossReporterOptions options_;
  StepAggregator aggregator_;

  // Held from the aggregator's answer until the metrics and the event files
  // have taken it, so that they see the runs' events in the aggregator's
  // order: a step published by one thread after another had evicted its run
  // and removed its series brought the series back, never to be removed
  // again (66 runs' series after 20,000 runs went through --max_runs=2).
  // Taken before mu_.
  absl::Mutex order_mu_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<TensorBoardWriter>> writers_
      ABSL_GUARDED_BY(mu_);
  // Every run given a TensorBoard directory so far; at most
  // max_tensorboard_runs names, kept after eviction so that a returning run
  // keeps its directory.
  absl::flat_hash_set<std::string> tensorboard_runs_ ABSL_GUARDED_BY(mu_);
  bool tensorboard_limit_logged_ ABSL_GUARDED_BY(mu_) = false;
  // What the event files have taken of max_tensorboard_bytes.
  int64_t tensorboard_bytes_ ABSL_GUARDED_BY(mu_);
  bool tensorboard_bytes_logged_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_LOSS_REPORTER_H_
