#ifndef KLSERVE_SERVER_METRICS_LOSS_REPORTER_H_
#define KLSERVE_SERVER_METRICS_LOSS_REPORTER_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/loss.h"
#include "server/metrics/loss_tags.h"
#include "server/metrics/metrics.h"
#include "server/metrics/step_aggregator.h"
#include "server/metrics/tensorboard_publisher.h"

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
  // The runs' event files.
  TensorBoardPublisherOptions tensorboard;
  // How often idle steps are finished.
  absl::Duration tick = absl::Seconds(1);
};

// Turns tagged requests into per-step losses: accumulates them by run, step
// and layer (StepAggregator), and publishes each finished step to
// Prometheus (Metrics) and to the run's TensorBoard event file
// (TensorBoardPublisher, on its own thread). A background thread finishes
// idle steps. A TensorBoard write failure is logged and counted, never
// returned to the RPC. Thread-safe.
class LossReporter {
 public:
  LossReporter(Metrics* metrics, LossReporterOptions options);
  // Stops the background thread and publishes what is still open.
  ~LossReporter();

  // Checked before a request computes, so that a refused request is counted
  // nowhere. For a tagged request (run set): INVALID_ARGUMENT, naming the
  // field, for a run name CheckRunName refuses, a missing step, or a layer
  // outside [0, max_layers_per_run), or a microbatch outside [0,
  // max_microbatches_per_step). Untagged requests are not aggregated;
  // INVALID_ARGUMENT naming tags.run for one that sets a step, a layer or
  // a microbatch without a run.
  absl::Status CheckTags(const LossTags& tags) const;

  // A request's loss. Untagged requests (no run) are not aggregated.
  absl::Status Add(const LossTags& tags, const IndexerKlResult& result,
                   double scaling_factor);

  // The FinishStep RPC: publishes the run's open step now. INVALID_ARGUMENT
  // (naming `run`) for a run name CheckRunName refuses; otherwise as
  // StepAggregator::Finish (ALREADY_EXISTS for a step already finished).
  absl::StatusOr<FinishedStep> FinishStep(absl::string_view run, int64_t step);
  // StepAggregator::LastPublished.
  std::optional<PublishedValues> LastPublished(absl::string_view run,
                                               int64_t step) const {
    return aggregator_.LastPublished(run, step);
  }

  // Publishes every open step, then writes and closes the event files (on
  // drain), waiting for them until `deadline` (TensorBoardPublisher::
  // Shutdown). Idempotent.
  void Shutdown(absl::Time deadline = absl::InfiniteFuture());

 private:
  void Publish(const std::vector<FinishedStep>& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  void Tick();

  Metrics* const metrics_;
  const LossReporterOptions options_;
  StepAggregator aggregator_;

  TensorBoardPublisher tensorboard_;

  // Held from the aggregator's answer until the metrics and the event files'
  // queue have taken it, so that they see the runs' events in the
  // aggregator's order: a step published by one thread after another had
  // evicted its run and removed its series brought the series back, never
  // to be removed again (66 runs' series after 20,000 runs went through
  // --max_runs=2). Nothing under it waits for the disk.
  absl::Mutex order_mu_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_LOSS_REPORTER_H_
