#include "server/metrics/metrics.h"

#include <cmath>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "civetweb.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/label_sanitizer.h"

namespace klserve::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Family<prometheus::Counter>& CounterFamily(
    prometheus::Registry& registry, const char* name, const char* help) {
  return BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(
    prometheus::Registry& registry, const char* name, const char* help) {
  return BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(
    prometheus::Registry& registry, const char* name, const char* help) {
  return BuildHistogram().Name(name).Help(help).Register(registry);
}

}  // namespace

const std::vector<double>& RequestDurationBuckets() {
  // From the sub-millisecond health and info calls to a unary projections
  // call at --max_compute_duration's default (10m) and a stream at
  // --max_stream_duration's (30m): a quantile past the last bucket would
  // read as that bucket's bound.
  static const auto* const kBuckets = new std::vector<double>{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
      1,      2.5,   5,      10,    30,   60,    120,  300, 600,  1800};
  return *kBuckets;
}

const std::vector<double>& LossBuckets() {
  // 1-2-5 steps from 1e-4 to 50: step losses after the usual c = 0.01 sit
  // around 1e-4 .. 1e-1, unscaled ones (c = 1) up to a few tens of nats at
  // the start of the warm-up.
  static const auto* const kBuckets = new std::vector<double>{
      1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2,
      0.1,  0.2,  0.5,  1,    2,    5,    10,   20,   50};
  return *kBuckets;
}

Metrics::Metrics(const MetricsOptions& options)
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(
          CounterFamily(*registry_, "klserve_requests_total",
                        "RPCs finished, by method and gRPC status code.")),
      request_duration_(HistogramFamily(
          *registry_, "klserve_request_duration_seconds",
          "Time from receiving an RPC to its final status, in seconds; "
          "refusals before any work (RESOURCE_EXHAUSTED, UNAVAILABLE, "
          "UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED) left out.")),
      received_bytes_(CounterFamily(*registry_, "klserve_received_bytes_total",
                                    "Request message bytes received.")),
      sent_bytes_(CounterFamily(*registry_, "klserve_sent_bytes_total",
                                "Response message bytes sent.")),
      rows_computed_(CounterFamily(*registry_, "klserve_rows_computed_total",
                                   "Query rows whose loss was computed.")
                         .Add({})),
      in_flight_(GaugeFamily(*registry_, "klserve_requests_in_flight",
                             "Calls holding a slot now: unary ComputeLoss "
                             "calls (of --max_concurrent_requests) and open "
                             "streams (of --max_open_streams).")
                     .Add({})),
      refused_at_limit_(CounterFamily(
          *registry_, "klserve_refused_at_limit_total",
          "Calls refused (RESOURCE_EXHAUSTED) at the limit of calls in flight, "
          "by the limit's flag; the clients retry them.")),
      untaken_answers_cancelled_(
          CounterFamily(*registry_, "klserve_untaken_answers_cancelled_total",
                        "Unary ComputeLoss answers cancelled because their "
                        "client left them untaken for --stream_idle_timeout.")
              .Add({})),
      shm_regions_(GaugeFamily(*registry_, "klserve_shared_memory_regions",
                               "Shared-memory regions registered now.")
                       .Add({})),
      shm_region_bytes_(
          GaugeFamily(*registry_, "klserve_shared_memory_region_bytes",
                      "Bytes of the shared-memory regions registered now.")
              .Add({})),
      tensorboard_errors_(
          CounterFamily(*registry_, "klserve_tensorboard_write_errors_total",
                        "Failed writes of TensorBoard event files.")
              .Add({})),
      tensorboard_skipped_steps_(
          CounterFamily(*registry_, "klserve_tensorboard_skipped_steps_total",
                        "Finished steps not written to TensorBoard: their "
                        "run came after --max_tensorboard_runs runs had a "
                        "directory, or the event files had taken "
                        "--max_tensorboard_bytes.")
              .Add({})),
      runs_removed_(CounterFamily(*registry_,
                                  "klserve_indexer_runs_removed_total",
                                  "Runs whose series were removed (evicted "
                                  "past the limit on tracked runs).")
                        .Add({})),
      late_samples_of_evicted_runs_(
          CounterFamily(*registry_,
                        "klserve_late_samples_of_evicted_runs_total",
                        "Samples of a step already finished of a run "
                        "evicted past the limit on tracked runs (which "
                        "they do not take back).")
              .Add({})),
      last_step_(GaugeFamily(*registry_, "klserve_indexer_last_step",
                             "The last finished step of the run.")),
      microbatches_(GaugeFamily(
          *registry_, "klserve_indexer_microbatches",
          "Distinct microbatch tags among the samples of the run's last "
          "finished step (an absent tag counts as 0); fewer than the job "
          "sends per step means samples were late or lost.")),
      loss_(GaugeFamily(*registry_, "klserve_indexer_loss",
                        "Indexer KL loss of the last finished step, times the "
                        "scaling factor; layer=\"all\" is the mean over "
                        "layers.")),
      loss_unscaled_(GaugeFamily(
          *registry_, "klserve_indexer_loss_unscaled",
          "Indexer KL loss of the last finished step, before the scaling "
          "factor.")),
      loss_sum_(CounterFamily(
          *registry_, "klserve_indexer_loss_sum_total",
          "Sum of the step losses (scaled) published, those >= 0; its rate "
          "less that of klserve_indexer_loss_negative_sum_total, divided by "
          "that of klserve_indexer_steps_total, is the mean.")),
      loss_negative_sum_(CounterFamily(
          *registry_, "klserve_indexer_loss_negative_sum_total",
          "Sum of -loss over the step losses (scaled) below 0 published (a "
          "negative scaling factor; MAXTEXT's KL rounded below 0).")),
      steps_(CounterFamily(*registry_, "klserve_indexer_steps_total",
                           "Steps whose (finite) loss was added to "
                           "klserve_indexer_loss_sum_total or "
                           "klserve_indexer_loss_negative_sum_total.")),
      loss_distribution_(HistogramFamily(
          *registry_, "klserve_indexer_loss_distribution",
          "Distribution of the step losses (scaled, mean over layers).")),
      nonfinite_steps_(CounterFamily(*registry_,
                                     "klserve_indexer_nonfinite_steps_total",
                                     "Steps whose loss was NaN or infinite.")),
      entropy_p_(GaugeFamily(
          *registry_, "klserve_indexer_entropy_p",
          "Mean entropy of the target distribution p over the last step's "
          "counted rows, in nats.")),
      entropy_q_(GaugeFamily(
          *registry_, "klserve_indexer_entropy_q",
          "Mean entropy of the indexer distribution q over the last step's "
          "counted rows, in nats.")),
      topk_recall_(GaugeFamily(
          *registry_, "klserve_indexer_topk_recall",
          "Mean target mass on the indexer's top-k keys over the last step's "
          "counted rows (0..1).")),
      late_samples_(CounterFamily(
          *registry_, "klserve_late_samples_total",
          "Samples that arrived after their step was finished (not "
          "counted in it).")) {
  GaugeFamily(*registry_, "klserve_build_info",
              "Always 1; the labels say what is running.")
      .Add({{"version", options.version},
            {"backend", options.backend},
            {"device", options.device}})
      .Set(1);
}

absl::Status Metrics::CheckListenAddress(absl::string_view address) {
  constexpr unsigned kCivetwebIpv6 = 8;  // mg_check_feature's bit for it
  if (absl::StartsWith(address, "[") && mg_check_feature(kCivetwebIpv6) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen: this build's HTTP server (civetweb) has no IPv6 "
        "(a host in brackets), "
        "got \"",
        address,
        "\"; give an IPv4 HOST:PORT (0.0.0.0:9464 for every interface), or "
        "--metrics_listen= to serve none"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(
    const MetricsOptions& options) {
  std::unique_ptr<Metrics> metrics(new Metrics(options));
  if (options.listen_address.empty()) return metrics;
  try {
    metrics->exposer_ =
        std::make_unique<prometheus::Exposer>(std::vector<std::string>{
            "listening_ports", options.listen_address, "num_threads",
            absl::StrCat(options.listen_threads), "request_timeout_ms",
            absl::StrCat(absl::ToInt64Milliseconds(kScrapeRequestTimeout))});
  } catch (const std::exception& e) {
    // civetweb throws when it cannot bind (address in use, bad address).
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen: cannot serve metrics on \"",
                     options.listen_address, "\": ", e.what()));
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  return metrics;
}

Metrics::~Metrics() = default;

int Metrics::port() const {
  if (exposer_ == nullptr) return 0;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string Metrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void Metrics::RegisterMethod(absl::string_view method) {
  const std::string m(method);
  for (int code = 0;
       code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
    requests_.Add({{"method", m},
                   {"code", absl::StatusCodeToString(
                                static_cast<absl::StatusCode>(code))}});
  }
  request_duration_.Add({{"method", m}}, RequestDurationBuckets());
  received_bytes_.Add({{"method", m}});
  sent_bytes_.Add({{"method", m}});
}

namespace {

// The codes a call ends with when it is turned away before it is worked on:
// admission (full, draining), the token, the peer, a method that is off.
bool IsRefusalBeforeWork(absl::string_view code) {
  return code == "RESOURCE_EXHAUSTED" || code == "UNAVAILABLE" ||
         code == "UNAUTHENTICATED" || code == "PERMISSION_DENIED" ||
         code == "UNIMPLEMENTED";
}

}  // namespace

void Metrics::RecordRequest(absl::string_view method, absl::string_view code,
                            double seconds, int64_t bytes_in, int64_t bytes_out,
                            int64_t rows) {
  const std::string m(method);
  requests_.Add({{"method", m}, {"code", std::string(code)}}).Increment();
  // Not the refusals before any work: an overloaded server refuses most
  // calls at once, and with them in, its latency quantiles would fall as its
  // clients wait longer. Failures after work (DEADLINE_EXCEEDED, INTERNAL,
  // a bad value found while computing) stay: they are the slow tail.
  // klserve_requests_total counts every call.
  if (!IsRefusalBeforeWork(code)) {
    request_duration_.Add({{"method", m}}, RequestDurationBuckets())
        .Observe(seconds);
  }
  // Counter::Increment ignores negative amounts; so does this.
  received_bytes_.Add({{"method", m}}).Increment(static_cast<double>(bytes_in));
  sent_bytes_.Add({{"method", m}}).Increment(static_cast<double>(bytes_out));
  if (rows > 0) rows_computed_.Increment(static_cast<double>(rows));
}

void Metrics::InFlight(int delta) {
  in_flight_.Increment(static_cast<double>(delta));
}

void Metrics::RefusedAtLimit(absl::string_view limit) {
  refused_at_limit_.Add({{"limit", std::string(limit)}}).Increment();
}

void Metrics::RegisterLimit(absl::string_view limit) {
  refused_at_limit_.Add({{"limit", std::string(limit)}});
}

void Metrics::CancelledUntakenAnswer() {
  untaken_answers_cancelled_.Increment();
}

void Metrics::SharedMemoryRegions(int regions, int64_t bytes) {
  shm_regions_.Set(regions);
  shm_region_bytes_.Set(static_cast<double>(bytes));
}

Metrics::RunSeries& Metrics::SeriesOf(const std::string& run) {
  auto [it, inserted] = runs_.try_emplace(run);
  if (inserted) {
    // The counters of rare events start at 0 with the run, so that a
    // dashboard shows 0 rather than "No data" until one happens.
    it->second.nonfinite_steps = &nonfinite_steps_.Add({{"run", run}});
    it->second.late_samples = &late_samples_.Add({{"run", run}});
  }
  return it->second;
}

Metrics::LayerSeries& Metrics::LayerSeriesOf(const std::string& run,
                                             RunSeries& series,
                                             const std::string& layer) {
  auto [it, inserted] = series.layers.try_emplace(layer);
  if (inserted) {
    const prometheus::Labels labels = {{"run", run}, {"layer", layer}};
    it->second.loss = &loss_.Add(labels);
    it->second.loss_unscaled = &loss_unscaled_.Add(labels);
    it->second.loss_sum = &loss_sum_.Add(labels);
    it->second.loss_negative_sum = &loss_negative_sum_.Add(labels);
    it->second.steps = &steps_.Add(labels);
  }
  return it->second;
}

void Metrics::SetLayer(const std::string& run, RunSeries& series,
                       const std::string& layer, double loss,
                       double unscaled_loss, bool finite) {
  LayerSeries& s = LayerSeriesOf(run, series, layer);
  s.loss->Set(loss);
  s.loss_unscaled->Set(unscaled_loss);
  if (finite) {
    if (loss >= 0) {
      s.loss_sum->Increment(loss);
    } else {
      s.loss_negative_sum->Increment(-loss);
    }
    s.steps->Increment();
  }
}

void Metrics::PublishStep(const FinishedStep& step) {
  const std::string run = SanitizeLabelValue(step.run);
  absl::MutexLock lock(&runs_mu_);
  RunSeries& series = SeriesOf(run);
  // The gauges of a step start with the run's first step, not with a late
  // sample that comes before it (which showed a last step of 0).
  if (series.last_step == nullptr) {
    series.last_step = &last_step_.Add({{"run", run}});
    series.microbatches = &microbatches_.Add({{"run", run}});
  }
  series.last_step->Set(static_cast<double>(step.step));
  series.microbatches->Set(static_cast<double>(step.microbatches));

  const bool finite = std::isfinite(step.loss);
  SetLayer(run, series, std::string(kAllLayersLabel), step.loss,
           step.unscaled_loss, finite);
  for (const LayerLoss& layer : step.layers) {
    SetLayer(run, series, LayerLabelValue(layer.layer), layer.loss,
             layer.unscaled_loss, std::isfinite(layer.loss));
  }
  if (finite) {
    if (series.distribution == nullptr) {
      series.distribution =
          &loss_distribution_.Add({{"run", run}}, LossBuckets());
    }
    series.distribution->Observe(step.loss);
  } else {
    series.nonfinite_steps->Increment();
  }

  if (step.mean_entropy_p.has_value()) {
    if (series.entropy_p == nullptr) {
      series.entropy_p = &entropy_p_.Add({{"run", run}});
    }
    series.entropy_p->Set(*step.mean_entropy_p);
  }
  if (step.mean_entropy_q.has_value()) {
    if (series.entropy_q == nullptr) {
      series.entropy_q = &entropy_q_.Add({{"run", run}});
    }
    series.entropy_q->Set(*step.mean_entropy_q);
  }
  if (step.topk_recall.has_value()) {
    if (series.topk_recall == nullptr) {
      series.topk_recall = &topk_recall_.Add({{"run", run}});
    }
    series.topk_recall->Set(*step.topk_recall);
  }
}

void Metrics::CountLateSample(absl::string_view run) {
  const std::string label = SanitizeLabelValue(run);
  absl::MutexLock lock(&runs_mu_);
  SeriesOf(label).late_samples->Increment();
}

void Metrics::RemoveRun(absl::string_view run) {
  const std::string label = SanitizeLabelValue(run);
  absl::MutexLock lock(&runs_mu_);
  auto it = runs_.find(label);
  if (it == runs_.end()) return;
  RunSeries& s = it->second;
  if (s.last_step != nullptr) {
    last_step_.Remove(s.last_step);
    microbatches_.Remove(s.microbatches);
  }
  if (s.distribution != nullptr) loss_distribution_.Remove(s.distribution);
  nonfinite_steps_.Remove(s.nonfinite_steps);
  if (s.entropy_p != nullptr) entropy_p_.Remove(s.entropy_p);
  if (s.entropy_q != nullptr) entropy_q_.Remove(s.entropy_q);
  if (s.topk_recall != nullptr) topk_recall_.Remove(s.topk_recall);
  late_samples_.Remove(s.late_samples);
  for (auto& [layer, l] : s.layers) {
    loss_.Remove(l.loss);
    loss_unscaled_.Remove(l.loss_unscaled);
    loss_sum_.Remove(l.loss_sum);
    loss_negative_sum_.Remove(l.loss_negative_sum);
    steps_.Remove(l.steps);
  }
  runs_.erase(it);
  runs_removed_.Increment();
}

void Metrics::CountLateSampleOfEvictedRun() {
  late_samples_of_evicted_runs_.Increment();
}

void Metrics::CountTensorBoardError() { tensorboard_errors_.Increment(); }

void Metrics::CountTensorBoardSkippedStep() {
  tensorboard_skipped_steps_.Increment();
}

}  // namespace klserve::server
