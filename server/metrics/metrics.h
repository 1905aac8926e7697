#ifndef KLSERVE_SERVER_METRICS_METRICS_H_
#define KLSERVE_SERVER_METRICS_METRICS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics/step_aggregator.h"

namespace klserve::server {

// The default of --metrics_listen: clashes with neither Prometheus (9090) nor
// the Pushgateway (9091).
inline constexpr absl::string_view kDefaultMetricsListen = "0.0.0.0:9464";

// How long the /metrics endpoint waits on one read or write of a connection
// (civetweb's request_timeout_ms, 30 s by default) before closing it. A
// scrape's request arrives in one packet and Prometheus's scrape timeout is
// 10 s by default, so 3 s is ample for real clients and frees a thread held
// by a stalled one well within a scrape.
inline constexpr absl::Duration kScrapeRequestTimeout = absl::Seconds(3);

struct MetricsOptions {
  // host:port of the HTTP endpoint serving /metrics (--metrics_listen);
  // port 0 picks a free port; empty serves nothing (the registry still
  // counts, and Scrape still works).
  std::string listen_address = std::string(kDefaultMetricsListen);
  // Threads answering scrapes. civetweb gives each connection a thread for
  // as long as it is open, so a few clients that connect and send nothing
  // (or half a request) would otherwise hold every thread and stall the
  // scrape; kScrapeRequestTimeout bounds how long each can hold one.
  size_t listen_threads = 8;
  // The labels of klserve_build_info.
  std::string version;
  std::string backend;  // e.g. "cpu", "cuda"
  std::string device;   // e.g. the CPU model or the GPU name
};

// The Prometheus metrics of one server: the service's request metrics and the
// per-step indexer loss of each training run (from StepAggregator), exposed
// over HTTP by prometheus-cpp on their own port.
//
// Series (Prometheus conventions: prefix klserve_, base units, counters
// ending in _total):
//   klserve_requests_total{method,code}          counter
//   klserve_request_duration_seconds{method}     histogram, 1 ms .. 60 s,
//                                                refusals before work aside
//   klserve_received_bytes_total{method}         counter
//   klserve_sent_bytes_total{method}             counter
//   klserve_rows_computed_total                  counter
//   klserve_requests_in_flight                   gauge
//   klserve_refused_at_limit_total{limit}        counter, RESOURCE_EXHAUSTED
//                                                refusals the clients retry
//   klserve_untaken_answers_cancelled_total      counter, unary answers
//                                                left untaken for
//                                                --stream_idle_timeout
//   klserve_shared_memory_regions                gauge, registered now
//   klserve_shared_memory_region_bytes           gauge, their byte_size sum
//   klserve_build_info{version,backend,device}   gauge, 1
//   klserve_tensorboard_write_errors_total       counter
//   klserve_tensorboard_skipped_steps_total      counter
//   klserve_indexer_runs_removed_total           counter
//   klserve_late_samples_of_evicted_runs_total   counter
// and per run (`run` sanitized by SanitizeLabelValue, which leaves the names
// the server accepts (CheckRunName) as they are; `layer` a layer number,
// "none" for untagged samples, "all" for the step's mean over layers):
//   klserve_indexer_last_step{run}                    gauge
//   klserve_indexer_microbatches{run}                 gauge, the last step
//   klserve_indexer_loss{run,layer}                   gauge, the last step
//   klserve_indexer_loss_unscaled{run,layer}          gauge, before c
//   klserve_indexer_loss_sum_total{run,layer}         counter, sum of losses
//                                                     >= 0
//   klserve_indexer_loss_negative_sum_total{run,layer} counter, sum of
//                                                     -loss over losses < 0
//   klserve_indexer_steps_total{run,layer}            counter, steps summed
//   klserve_indexer_loss_distribution{run}            histogram of step losses
//   klserve_indexer_nonfinite_steps_total{run}        counter
//   klserve_indexer_entropy_p{run}, _entropy_q{run}   gauges, nats, if sent
//   klserve_indexer_topk_recall{run}                  gauge, if sent
//   klserve_late_samples_total{run}                   counter
// The mean loss over a window w, across replicas, is
//     (sum(rate(klserve_indexer_loss_sum_total[w]))
//      - sum(rate(klserve_indexer_loss_negative_sum_total[w])))
//   / sum(rate(klserve_indexer_steps_total[w])).
// A counter cannot go down, so a negative loss (a negative scaling factor,
// or MAXTEXT's KL a rounding below 0) has a counter of its own; in one
// counter it would have been dropped while its step counted.
// A step whose loss is NaN or infinite sets the gauges (so alerts see it) and
// counts in nonfinite_steps_total, but stays out of the sums, the step
// counts and the histogram, which would otherwise stay NaN forever.
//
// Thread-safe: every method may be called from any thread.
class Metrics {
 public:
  // INVALID_ARGUMENT naming --metrics_listen when this build's HTTP server
  // cannot take the HOST:PORT `address` at all: an IPv6 host ("[::1]:9464")
  // where civetweb was built without IPv6, as Debian's is (it failed at
  // the bind with "null context when constructing CivetServer").
  static absl::Status CheckListenAddress(absl::string_view address);

  // Starts the HTTP endpoint when options.listen_address is not empty.
  // UNAVAILABLE when it cannot listen there (address in use, malformed).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(
      const MetricsOptions& options);

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;
  ~Metrics();

  // The port the endpoint listens on (port 0 resolved), or 0 without one.
  int port() const;

  // The text exposition of every series, as a scrape returns it.
  std::string Scrape() const;

  // Creates a method's series at zero, one per gRPC code, so that rate()
  // and increase() see a method's first calls and its first failures (a
  // series born at its first increment holds them in its first sample,
  // where they count as no increase). Optional; RecordRequest creates them
  // too.
  void RegisterMethod(absl::string_view method);

  // One finished RPC: `code` is the gRPC code's name ("OK",
  // "INVALID_ARGUMENT", ...), `seconds` the time from receipt to the final
  // status, `rows` the rows computed (0 for an RPC that computed nothing).
  void RecordRequest(absl::string_view method, absl::string_view code,
                     double seconds, int64_t bytes_in, int64_t bytes_out,
                     int64_t rows);

  // +1 when a request starts, -1 when it ends.
  void InFlight(int delta);
  // A call refused at the limit of calls in flight, `limit` the flag
  // ("max_concurrent_requests"). It is also a RESOURCE_EXHAUSTED in
  // klserve_requests_total; this tells it from a size limit's, which the
  // clients do not retry.
  void RefusedAtLimit(absl::string_view limit);
  // Creates a limit's series at zero, as RegisterMethod does.
  void RegisterLimit(absl::string_view limit);

  // A unary answer cancelled because its client left it untaken for
  // --stream_idle_timeout.
  void CancelledUntakenAnswer();

  // The shared-memory regions registered now, and their bytes.
  void SharedMemoryRegions(int regions, int64_t bytes);

  // Sets the run's series from a finished step (see the class comment).
  void PublishStep(const FinishedStep& step);

  // A sample that arrived after its step was finished.
  void CountLateSample(absl::string_view run);
  // The same for a run evicted past --max_runs, which has no series (the
  // sample does not take it back).
  void CountLateSampleOfEvictedRun();

  // Removes every series of `run` (for a run the aggregator evicted). A
  // later PublishStep or CountLateSample of the run creates them anew.
  void RemoveRun(absl::string_view run);

  void CountTensorBoardError();
  // A finished step not written to TensorBoard: its run came after
  // --max_tensorboard_runs runs had been given a directory, or the event
  // files had taken --max_tensorboard_bytes.
  void CountTensorBoardSkippedStep();

 private:
  struct LayerSeries {
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* loss_unscaled = nullptr;
    prometheus::Counter* loss_sum = nullptr;
    prometheus::Counter* loss_negative_sum = nullptr;
    prometheus::Counter* steps = nullptr;
  };
  struct RunSeries {
    prometheus::Gauge* last_step = nullptr;     // from the first step
    prometheus::Gauge* microbatches = nullptr;  // likewise
    prometheus::Histogram* distribution = nullptr;
    prometheus::Counter* nonfinite_steps = nullptr;  // from the start
    prometheus::Gauge* entropy_p = nullptr;
    prometheus::Gauge* entropy_q = nullptr;
    prometheus::Gauge* topk_recall = nullptr;
    prometheus::Counter* late_samples = nullptr;  // from the start
    // By layer label.
    absl::flat_hash_map<std::string, LayerSeries> layers;
  };

  explicit Metrics(const MetricsOptions& options);

  // The series of run label `run`, created on first use.
  RunSeries& SeriesOf(const std::string& run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runs_mu_);
  LayerSeries& LayerSeriesOf(const std::string& run, RunSeries& series,
                             const std::string& layer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(runs_mu_);
  void SetLayer(const std::string& run, RunSeries& series,
                const std::string& layer, double loss, double unscaled_loss,
                bool finite) ABSL_EXCLUSIVE_LOCKS_REQUIRED(runs_mu_);

  // Declared first, destroyed last: the families below live in it and the
  // exposer reads it.
  const std::shared_ptr<prometheus::Registry> registry_;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Counter>& received_bytes_;
  prometheus::Family<prometheus::Counter>& sent_bytes_;
  prometheus::Counter& rows_computed_;
  prometheus::Gauge& in_flight_;
  prometheus::Family<prometheus::Counter>& refused_at_limit_;
  prometheus::Counter& untaken_answers_cancelled_;
  prometheus::Gauge& shm_regions_;
  prometheus::Gauge& shm_region_bytes_;
  prometheus::Counter& tensorboard_errors_;
  prometheus::Counter& tensorboard_skipped_steps_;
  prometheus::Counter& runs_removed_;
  prometheus::Counter& late_samples_of_evicted_runs_;

  prometheus::Family<prometheus::Gauge>& last_step_;
  prometheus::Family<prometheus::Gauge>& microbatches_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& loss_unscaled_;
  prometheus::Family<prometheus::Counter>& loss_sum_;
  prometheus::Family<prometheus::Counter>& loss_negative_sum_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Histogram>& loss_distribution_;
  prometheus::Family<prometheus::Counter>& nonfinite_steps_;
  prometheus::Family<prometheus::Gauge>& entropy_p_;
  prometheus::Family<prometheus::Gauge>& entropy_q_;
  prometheus::Family<prometheus::Gauge>& topk_recall_;
  prometheus::Family<prometheus::Counter>& late_samples_;

  // Serialises the creation and removal of per-run series, so that a
  // RemoveRun never frees a series another thread is about to set.
  absl::Mutex runs_mu_;
  absl::flat_hash_map<std::string, RunSeries> runs_ ABSL_GUARDED_BY(runs_mu_);

  // Declared last, destroyed first: no scrape runs once the rest is gone.
  std::unique_ptr<prometheus::Exposer> exposer_;
};

// The bucket boundaries of klserve_request_duration_seconds.
const std::vector<double>& RequestDurationBuckets();
// The bucket boundaries of klserve_indexer_loss_distribution.
const std::vector<double>& LossBuckets();

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_METRICS_H_
