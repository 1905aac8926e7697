#include "server/metrics/loss_reporter.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/tensorboard/run_name.h"

namespace klserve::server {

namespace {

// What a run's directories take: one per part of its name (a/b/c makes
// three), a block each. One name can make 64.
int64_t DirectoryBytes(const std::string& run) {
  return LossReporter::kEventFileCharge * (1 + absl::c_count(run, '/'));
}

// What the event files and directories already in `dir` (and below) take,
// charged as LossReporter charges its own: each file's bytes in whole 4 KiB
// blocks, and a block a directory. A restarted server (a container
// restarted in its pod, whose emptyDir stays) thereby keeps the files of
// its earlier lives within the bound. Unreadable entries count nothing.
int64_t TensorBoardBytesIn(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr int64_t kBlock = LossReporter::kEventFileCharge;
  int64_t total = 0;
  std::error_code error;
  for (fs::recursive_directory_iterator
           it(dir, fs::directory_options::skip_permission_denied, error),
       end;
       !error && it != end; it.increment(error)) {
    std::error_code ignored;
    if (it->is_directory(ignored)) {
      total += kBlock;
      continue;
    }
    if (!it->is_regular_file(ignored) ||
        !absl::StartsWith(it->path().filename().string(),
                          "events.out.tfevents.")) {
      continue;
    }
    const uintmax_t size = it->file_size(ignored);
    if (ignored) continue;
    total += (static_cast<int64_t>(size) + kBlock - 1) / kBlock * kBlock;
  }
  return total;
}

}  // namespace

LossReporter::LossReporter(Metrics* metrics, LossReporterOptions options)
    : metrics_(metrics),
      options_(std::move(options)),
      aggregator_(options_.steps),
      tensorboard_bytes_(options_.tensorboard_dir.empty()
                             ? 0
                             : TensorBoardBytesIn(options_.tensorboard_dir)),
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
  if (tags.run.empty()) return absl::OkStatus();
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
  if (tags.microbatch < 0 ||
      tags.microbatch >= options_.max_microbatches_per_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tags.microbatch: must be in [0, ", options_.max_microbatches_per_step,
        "), got ", tags.microbatch,
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
  sample.microbatch = tags.microbatch;
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
  if (added->late) metrics_->CountLateSample(sample.run);
  Publish(added->finished);
  for (const std::string& run : added->evicted_runs) {
    metrics_->RemoveRun(run);
    absl::MutexLock lock(&mu_);
    writers_.erase(run);  // closes its file
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
    if (!options_.tensorboard_dir.empty()) WriteTensorBoard(step);
  }
}

bool LossReporter::TakeTensorBoardRun(const std::string& run) {
  if (tensorboard_runs_.contains(run)) return true;
  if (static_cast<int>(tensorboard_runs_.size()) <
      options_.max_tensorboard_runs) {
    tensorboard_runs_.insert(run);
    tensorboard_bytes_ += DirectoryBytes(run);
    return true;
  }
  // Once per process: a caller sending new run names would otherwise fill
  // the log instead of the disk.
  if (!tensorboard_limit_logged_) {
    tensorboard_limit_logged_ = true;
    std::fprintf(stderr,
                 "klserve: TensorBoard: %d runs have a directory "
                 "(--max_tensorboard_runs); run \"%s\" and later new runs "
                 "get no event file (Prometheus is unaffected; counted in "
                 "klserve_tensorboard_skipped_steps_total)\n",
                 options_.max_tensorboard_runs, run.c_str());
  }
  return false;
}

bool LossReporter::TensorBoardBytesLeft(const std::string& run,
                                        int64_t needed) {
  if (tensorboard_bytes_ < options_.max_tensorboard_bytes &&
      needed < options_.max_tensorboard_bytes - tensorboard_bytes_) {
    return true;
  }
  if (!tensorboard_bytes_logged_) {
    tensorboard_bytes_logged_ = true;
    std::fprintf(stderr,
                 "klserve: TensorBoard: the event files have taken %lld bytes "
                 "(--max_tensorboard_bytes=%lld); from run \"%s\" on, steps "
                 "get no event (Prometheus is unaffected; counted in "
                 "klserve_tensorboard_skipped_steps_total)\n",
                 static_cast<long long>(tensorboard_bytes_),
                 static_cast<long long>(options_.max_tensorboard_bytes),
                 run.c_str());
  }
  return false;
}

// Past --max_tensorboard_runs a new run's steps are skipped, not refused:
// the loss still reaches Prometheus and the training job sees no error,
// while a caller inventing run names cannot fill the disk with directories.
// The same past --max_tensorboard_bytes, for a caller publishing steps
// without end. No directory or file is ever deleted to make room, so no
// researcher's data goes.
void LossReporter::WriteTensorBoard(const FinishedStep& step) {
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(step.run);
  // A new run's directories must fit whole: one name can make 64 of them.
  const int64_t directories =
      tensorboard_runs_.contains(step.run) ? 0 : DirectoryBytes(step.run);
  if (!TensorBoardBytesLeft(step.run, directories) ||
      (it == writers_.end() && !TakeTensorBoardRun(step.run))) {
    metrics_->CountTensorBoardSkippedStep();
    return;
  }
  if (it == writers_.end()) it = writers_.emplace(step.run, nullptr).first;
  std::unique_ptr<TensorBoardWriter>& writer = it->second;
  absl::Status status;
  int64_t framed_before = 0;
  if (writer == nullptr) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> opened =
        TensorBoardWriter::Open(options_.tensorboard_dir, step.run);
    if (opened.ok()) {
      writer = *std::move(opened);
      tensorboard_bytes_ += kEventFileCharge;
    } else {
      status = opened.status();
    }
  } else {
    framed_before = writer->framed_bytes();
  }
  if (writer != nullptr) {
    // Stamped with the step's last sample, not the publishing: a step the
    // idle timeout finishes is published minutes after its work.
    const auto scalar = [&](absl::string_view tag, double value) {
      if (status.ok()) {
        status =
            writer->AddScalar(tag, step.step, value, step.last_sample_time);
      }
    };
    scalar("indexer_loss", step.loss);
    for (const LayerLoss& layer : step.layers) {
      if (layer.layer) {
        scalar(absl::StrCat("indexer_loss/layer_", *layer.layer), layer.loss);
      }
    }
    if (step.mean_entropy_p) scalar("indexer_entropy_p", *step.mean_entropy_p);
    if (step.mean_entropy_q) scalar("indexer_entropy_q", *step.mean_entropy_q);
    if (step.topk_recall) scalar("indexer_topk_recall", *step.topk_recall);
    tensorboard_bytes_ += writer->framed_bytes() - framed_before;
  }
  if (!status.ok()) {
    metrics_->CountTensorBoardError();
    std::fprintf(stderr, "klserve: TensorBoard, run \"%s\": %s\n",
                 step.run.c_str(), status.ToString().c_str());
    writers_.erase(step.run);  // reopen a fresh file next time
  }
}

void LossReporter::Tick() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.tick);
      if (stopping_) return;
    }
    {
      absl::MutexLock order(&order_mu_);
      Publish(aggregator_.FinishIdle(absl::Now()));
    }
    absl::MutexLock lock(&mu_);
    for (auto& [run, writer] : writers_) {
      if (absl::Status status = writer->Flush(); !status.ok()) {
        metrics_->CountTensorBoardError();
        std::fprintf(stderr, "klserve: TensorBoard flush, run \"%s\": %s\n",
                     run.c_str(), status.ToString().c_str());
      }
    }
  }
}

void LossReporter::Shutdown() {
  {
    absl::MutexLock order(&order_mu_);
    Publish(aggregator_.FinishAll());
  }
  absl::MutexLock lock(&mu_);
  for (auto& [run, writer] : writers_) {
    if (absl::Status status = writer->Close(); !status.ok()) {
      metrics_->CountTensorBoardError();
      std::fprintf(stderr, "klserve: TensorBoard close, run \"%s\": %s\n",
                   run.c_str(), status.ToString().c_str());
    }
  }
  writers_.clear();
}

}  // namespace klserve::server
