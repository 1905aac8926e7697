#include "server/metrics/tensorboard_publisher.h"

#include <pthread.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace klserve::server {
namespace {

// What a run's directories take: one per part of its name (a/b/c makes
// three), a block each. One name can make 64.
int64_t DirectoryBytes(const std::string& run) {
  return TensorBoardPublisher::kEventFileCharge * (1 + absl::c_count(run, '/'));
}

// What the event files and directories already in `dir` (and below) take,
// charged as the publisher charges its own: each file's bytes in whole 4 KiB
// blocks, and a block a directory. A restarted server (a container
// restarted in its pod, whose emptyDir stays) thereby keeps the files of
// its earlier lives within the bound. Unreadable entries count nothing.
int64_t BytesIn(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr int64_t kBlock = TensorBoardPublisher::kEventFileCharge;
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

TensorBoardPublisher::TensorBoardPublisher(Metrics* metrics,
                                           TensorBoardPublisherOptions options)
    : metrics_(metrics), options_(std::move(options)) {
  if (options_.dir.empty()) return;
  bytes_ = BytesIn(options_.dir);
  thread_ = std::thread([this] { Run(); });
}

TensorBoardPublisher::~TensorBoardPublisher() { Shutdown(); }

void TensorBoardPublisher::Publish(const FinishedStep& step) {
  if (options_.dir.empty()) return;
  if (!Enqueue(step)) metrics_->CountTensorBoardSkippedStep();
}

void TensorBoardPublisher::CloseRun(const std::string& run) {
  // Left queued or not, the file stays within max_runs open files.
  if (!options_.dir.empty()) Enqueue(RunEvicted{run});
}

bool TensorBoardPublisher::Enqueue(Job job) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  if (static_cast<int>(queue_.size()) + (writing_ ? 1 : 0) >=
      options_.max_queued) {
    // Once per process: a disk that stalls for good would otherwise fill the
    // log.
    if (!queue_full_logged_) {
      queue_full_logged_ = true;
      std::fprintf(stderr,
                   "klserve: TensorBoard: %d steps wait for the event files "
                   "(--max_tensorboard_queued_steps; is the disk stalled?); "
                   "steps past it get no event (Prometheus is unaffected; "
                   "counted in klserve_tensorboard_skipped_steps_total)\n",
                   options_.max_queued);
    }
    return false;
  }
  queue_.push_back(std::move(job));
  return true;
}

bool TensorBoardPublisher::Shutdown(absl::Time deadline) {
  if (!thread_.joinable()) return true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (!mu_.AwaitWithDeadline(absl::Condition(&stopped_), deadline)) {
      std::fprintf(stderr,
                   "klserve: TensorBoard: the event files are still being "
                   "written at the drain's end (is the disk stalled?); %zu "
                   "steps waiting are not written\n",
                   queue_.size());
      return false;
    }
  }
  thread_.join();
  return true;
}

void TensorBoardPublisher::Run() {
  // Named, so that a stack dump or `top -H` shows which thread waits on
  // the disk.
  pthread_setname_np(pthread_self(), "klserve-tboard");
  absl::Time last_flush = absl::Now();
  const auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  };
  while (true) {
    // One job at a time, counted against max_queued while it is written.
    std::optional<Job> job;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      mu_.AwaitWithTimeout(absl::Condition(&has_work), options_.flush_interval);
      if (queue_.empty() && stopping_) break;
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      }
    }
    if (job.has_value()) {
      if (const auto* step = std::get_if<FinishedStep>(&*job)) {
        Write(*step);
      } else {
        writers_.erase(std::get<RunEvicted>(*job).run);  // closes its file
      }
    }
    if (absl::Now() - last_flush >= options_.flush_interval) {
      FlushAll();
      last_flush = absl::Now();
    }
  }
  CloseAll();
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

bool TensorBoardPublisher::TakeRun(const std::string& run) {
  if (runs_.contains(run)) return true;
  if (static_cast<int>(runs_.size()) < options_.max_runs) {
    runs_.insert(run);
    bytes_ += DirectoryBytes(run);
    return true;
  }
  // Once per process: a caller sending new run names would otherwise fill
  // the log instead of the disk.
  if (!runs_limit_logged_) {
    runs_limit_logged_ = true;
    std::fprintf(stderr,
                 "klserve: TensorBoard: %d runs have a directory "
                 "(--max_tensorboard_runs); run \"%s\" and later new runs "
                 "get no event file (Prometheus is unaffected; counted in "
                 "klserve_tensorboard_skipped_steps_total)\n",
                 options_.max_runs, run.c_str());
  }
  return false;
}

bool TensorBoardPublisher::BytesLeft(const std::string& run, int64_t needed) {
  if (bytes_ < options_.max_bytes && needed < options_.max_bytes - bytes_) {
    return true;
  }
  if (!bytes_limit_logged_) {
    bytes_limit_logged_ = true;
    std::fprintf(stderr,
                 "klserve: TensorBoard: the event files have taken %lld bytes "
                 "(--max_tensorboard_bytes=%lld); from run \"%s\" on, steps "
                 "get no event (Prometheus is unaffected; counted in "
                 "klserve_tensorboard_skipped_steps_total)\n",
                 static_cast<long long>(bytes_),
                 static_cast<long long>(options_.max_bytes), run.c_str());
  }
  return false;
}

// Past --max_tensorboard_runs a new run's steps are skipped, not refused:
// the loss still reaches Prometheus and the training job sees no error,
// while a caller inventing run names cannot fill the disk with directories.
// The same past --max_tensorboard_bytes, for a caller publishing steps
// without end. No directory or file is ever deleted to make room, so no
// researcher's data goes.
void TensorBoardPublisher::Write(const FinishedStep& step) {
  auto it = writers_.find(step.run);
  // A new run's directories must fit whole: one name can make 64 of them.
  const int64_t directories =
      runs_.contains(step.run) ? 0 : DirectoryBytes(step.run);
  if (!BytesLeft(step.run, directories) ||
      (it == writers_.end() && !TakeRun(step.run))) {
    metrics_->CountTensorBoardSkippedStep();
    return;
  }
  if (it == writers_.end()) {
    // An eviction's close skipped at a full queue must not leave files open
    // past the runs tracked: the one written least recently goes.
    if (static_cast<int>(writers_.size()) >= options_.max_open_files) {
      writers_.erase(
          absl::c_min_element(writers_, [](const auto& a, const auto& b) {
            return a.second.last_write < b.second.last_write;
          }));
    }
    it = writers_.emplace(step.run, OpenFile{}).first;
  }
  it->second.last_write = ++writes_;
  std::unique_ptr<TensorBoardWriter>& writer = it->second.writer;
  absl::Status status;
  int64_t framed_before = 0;
  if (writer == nullptr) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> opened =
        TensorBoardWriter::Open(options_.dir, step.run);
    if (opened.ok()) {
      writer = *std::move(opened);
      bytes_ += kEventFileCharge;
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
    bytes_ += writer->framed_bytes() - framed_before;
  }
  if (status.ok()) {
    it->second.unflushed = true;
  } else {
    CountFailure(step.run, status);
    writers_.erase(step.run);  // its next step starts a new file
  }
}

void TensorBoardPublisher::CountFailure(const std::string& run,
                                        const absl::Status& status) {
  metrics_->CountTensorBoardError();
  if (failing_runs_.insert(run).second) {
    std::fprintf(stderr,
                 "klserve: TensorBoard, run \"%s\": %s (further failures of "
                 "this run are counted in "
                 "klserve_tensorboard_write_errors_total, and logged again "
                 "after a step of it reaches its file)\n",
                 run.c_str(), status.ToString().c_str());
  }
}

void TensorBoardPublisher::FlushAll() {
  // A failed flush keeps its file (cut back to its last whole record): on a
  // disk that fails now and then, a new file per failure would leave many
  // that hold little more than their version record.
  for (auto& [run, file] : writers_) {
    if (!file.unflushed) continue;
    file.unflushed = false;
    if (absl::Status status = file.writer->Flush(); status.ok()) {
      failing_runs_.erase(run);  // its steps are in its file
    } else {
      CountFailure(run, status);
    }
  }
}

void TensorBoardPublisher::CloseAll() {
  for (auto& [run, file] : writers_) {
    if (absl::Status status = file.writer->Close(); !status.ok()) {
      CountFailure(run, status);
    }
  }
  writers_.clear();
}

}  // namespace klserve::server
