#include "server/metrics/loss_reporter.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/tensorboard/run_name.h"

namespace klserve::server {
namespace {

// The event files open at once: one for each run the aggregator tracks.
TensorBoardPublisherOptions WithOpenFiles(TensorBoardPublisherOptions options,
                                          int max_runs) {
  options.max_open_files = std::max(max_runs, 1);
  return options;
}

}  // namespace

LossReporter::LossReporter(Metrics* metrics, LossReporterOptions options)
    : metrics_(metrics),
      options_(std::move(options)),
      aggregator_(options_.steps),
      tensorboard_(metrics, WithOpenFiles(options_.tensorboard,
                                          options_.steps.max_runs)),
      ticker_([this] { Tick(); }) {}

LossReporter::~LossReporter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  ticker_.join();
  Shutdown();
}

absl::Status LossReporter::CheckTags(const LossTags& tags) const {
  if (tags.run.empty()) {
    // A step or a layer without a run would be aggregated nowhere, which
    // the caller cannot see.
    if (tags.step.has_value() || tags.layer.has_value() ||
        tags.microbatch.has_value()) {
      return absl::InvalidArgumentError(
          "tags.run: required when tags.step, tags.layer or tags.microbatch "
          "is set (the per-step loss is kept per run; without a run the "
          "request is not aggregated)");
    }
    return absl::OkStatus();
  }
  if (absl::Status status = CheckRunName(tags.run, "tags.run"); !status.ok()) {
    return status;
  }
  if (!tags.step.has_value()) {
    return absl::InvalidArgumentError(
        "tags.step: required when tags.run is set (steps are aggregated per "
        "run)");
  }
  if (tags.layer.has_value() &&
      (*tags.layer < 0 || *tags.layer >= options_.max_layers_per_run)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tags.layer: must be in [0, ", options_.max_layers_per_run, "), got ",
        *tags.layer,
        " (--max_layers_per_run bounds the layers of a run: each adds "
        "Prometheus series)"));
  }
  const int32_t microbatch = tags.microbatch.value_or(0);
  if (microbatch < 0 || microbatch >= options_.max_microbatches_per_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tags.microbatch: must be in [0, ", options_.max_microbatches_per_step,
        "), got ", microbatch,
        " (--max_microbatches_per_step bounds the distinct microbatches a "
        "step keeps until it is published)"));
  }
  return absl::OkStatus();
}

absl::Status LossReporter::Add(const LossTags& tags,
                               const IndexerKlResult& result,
                               double scaling_factor) {
  if (tags.run.empty()) return absl::OkStatus();
  if (absl::Status status = CheckTags(tags); !status.ok()) return status;
  StepSample sample;
  sample.run = tags.run;
  sample.step = *tags.step;
  sample.layer = tags.layer;
  sample.microbatch = tags.microbatch.value_or(0);
  sample.kl_sum = result.kl_sum;
  sample.rows = result.denominator;
  sample.scaling_factor = scaling_factor;
  if (result.diagnostics) {
    SampleDiagnostics& d = sample.diagnostics.emplace();
    const double counted = static_cast<double>(result.rows_counted);
    d.rows_counted = result.rows_counted;
    d.entropy_p_sum = result.diagnostics->mean_entropy_p * counted;
    d.entropy_q_sum = result.diagnostics->mean_entropy_q * counted;
    if (result.diagnostics->topk_recall) {
      d.recall_sum = *result.diagnostics->topk_recall * counted;
    }
  }
  absl::MutexLock order(&order_mu_);
  absl::StatusOr<AddResult> added = aggregator_.Add(sample, absl::Now());
  if (!added.ok()) return added.status();
  if (added->of_evicted_run) {
    metrics_->CountLateSampleOfEvictedRun();
  } else if (added->late) {
    metrics_->CountLateSample(sample.run);
  }
  Publish(added->finished);
  for (const std::string& run : added->evicted_runs) {
    metrics_->RemoveRun(run);
    tensorboard_.CloseRun(run);
  }
  return absl::OkStatus();
}

absl::StatusOr<FinishedStep> LossReporter::FinishStep(absl::string_view run,
                                                      int64_t step) {
  if (absl::Status status = CheckRunName(run, "run"); !status.ok()) {
    return status;
  }
  absl::MutexLock order(&order_mu_);
  absl::StatusOr<FinishedStep> finished = aggregator_.Finish(run, step);
  if (finished.ok()) Publish({*finished});
  return finished;
}

void LossReporter::Publish(const std::vector<FinishedStep>& steps) {
  for (const FinishedStep& step : steps) {
    metrics_->PublishStep(step);
    tensorboard_.Publish(step);
  }
}

void LossReporter::Tick() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.tick);
      if (stopping_) return;
    }
    absl::MutexLock order(&order_mu_);
    Publish(aggregator_.FinishIdle(absl::Now()));
  }
}

void LossReporter::Shutdown(absl::Time deadline) {
  {
    absl::MutexLock order(&order_mu_);
    Publish(aggregator_.FinishAll());
  }
  tensorboard_.Shutdown(deadline);
}

}  // namespace klserve::server
