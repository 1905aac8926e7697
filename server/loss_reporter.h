#ifndef KLSERVE_SERVER_LOSS_REPORTER_H_
#define KLSERVE_SERVER_LOSS_REPORTER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/loss.h"
#include "klserve/v1/klserve.pb.h"
#include "server/metrics.h"
#include "server/step_aggregator.h"
#include "server/tensorboard_writer.h"

namespace klserve::server {

struct LossReporterOptions {
  StepAggregatorOptions steps;
  // Where each run's TensorBoard event file goes; empty writes none.
  std::string tensorboard_dir;
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
  LossReporter(Metrics* metrics, LossReporterOptions options);
  // Stops the background thread and publishes what is still open.
  ~LossReporter();

  // INVALID_ARGUMENT when a run comes without a step; checked before a
  // request computes.
  static absl::Status CheckTags(const v1::Tags& tags);

  // A request's loss. Untagged requests (no run) are not aggregated.
  absl::Status Add(const v1::Tags& tags, const IndexerKlResult& result,
                   double scaling_factor);

  // The FinishStep RPC: publishes the run's open step now.
  absl::StatusOr<FinishedStep> FinishStep(absl::string_view run, int64_t step);

  // Publishes every open step and flushes and closes the event files (on
  // drain). Idempotent.
  void Shutdown();

 private:
  void Publish(const std::vector<FinishedStep>& steps);
  void WriteTensorBoard(const FinishedStep& step);
  void Tick();

  Metrics* const metrics_;
  const LossReporterOptions options_;
  StepAggregator aggregator_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<TensorBoardWriter>> writers_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_LOSS_REPORTER_H_
