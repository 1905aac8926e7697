#ifndef KLSERVE_SERVER_METRICS_TENSORBOARD_PUBLISHER_H_
#define KLSERVE_SERVER_METRICS_TENSORBOARD_PUBLISHER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics/metrics.h"
#include "server/metrics/step_aggregator.h"
#include "server/tensorboard/tensorboard_writer.h"

namespace klserve::server {

struct TensorBoardPublisherOptions {
  // Where each run's event file goes; empty writes none (and starts no
  // thread).
  std::string dir;
  // Runs given a directory in this process's lifetime. A run past the bound
  // still gets its Prometheus series but no event file. Directories are
  // never deleted: they hold researchers' data, and a run evicted from the
  // aggregator writes a new event file into its own directory when it comes
  // back.
  int max_runs = 1024;
  // Disk space the event files in `dir` may take, all runs together: those
  // found there at start (each in whole kEventFileCharge blocks, and a block
  // for each directory: a restarted server's earlier files), then every
  // record framed, plus kEventFileCharge for each file opened (a run evicted
  // from the aggregator opens a new file when it returns) and for each
  // directory a new run's name makes (a new run whose directories would pass
  // the bound gets none). Once it is spent, steps reach Prometheus only; the
  // step that spends it is written whole, so the files may pass it by one
  // step's records. Without it a caller publishing steps as fast as it can
  // would fill the disk.
  int64_t max_bytes = int64_t{16} << 30;
  // Steps and run evictions waiting for the writing thread. A disk that
  // stalls (a network volume, writeback throttling) then delays the event
  // files only: past the bound a step is skipped, never waited for. A step
  // waiting holds its layers' values (up to about 7 KB at 128 layers).
  int max_queued = 1024;
  // Event files open at once: the runs tracked (--max_runs). An evicted
  // run's file is closed through the queue; should that be full, the file
  // written least recently is closed when another opens.
  int max_open_files = 64;
  // How often the event files are flushed while steps come in.
  absl::Duration flush_interval = absl::Seconds(1);
};

// Writes finished steps to their runs' TensorBoard event files on a thread of
// its own, so that a request publishing a step never waits for the disk. The
// steps are written in the order they are published, and a run evicted
// from the aggregator has its file closed in that order too. Steps it cannot
// write (past a bound above, or a write error: logged) are counted in
// klserve_tensorboard_skipped_steps_total or _errors_total, never returned to
// the request. Thread-safe.
class TensorBoardPublisher {
 public:
  // What opening an event file counts against max_bytes: the block a file
  // takes on disk, however little it holds.
  static constexpr int64_t kEventFileCharge = 4096;

  TensorBoardPublisher(Metrics* metrics, TensorBoardPublisherOptions options);
  // Shutdown().
  ~TensorBoardPublisher();

  TensorBoardPublisher(const TensorBoardPublisher&) = delete;
  TensorBoardPublisher& operator=(const TensorBoardPublisher&) = delete;

  // Queues the step for its run's event file.
  void Publish(const FinishedStep& step);
  // Queues closing the run's event file (the run left the aggregator).
  void CloseRun(const std::string& run);

  // Writes what is queued, closes the files and stops the thread; what is
  // published later is skipped. Waits for the thread until `deadline`, and
  // past it (a disk that stalls) logs what was left unwritten and returns
  // false, leaving the thread to the process's exit rather than holding a
  // drain for ever. Idempotent.
  bool Shutdown(absl::Time deadline = absl::InfiniteFuture());

 private:
  struct RunEvicted {
    std::string run;
  };
  using Job = std::variant<FinishedStep, RunEvicted>;

  // Queues `job` unless the queue is full or stopped; false then.
  bool Enqueue(Job job);
  // The thread: takes the queued jobs, writes them, flushes.
  void Run();
  void Write(const FinishedStep& step);
  void FlushAll();
  // A failed open, write, flush or close of `run`'s file: counted, and
  // logged when the run starts failing.
  void CountFailure(const std::string& run, const absl::Status& status);
  void CloseAll();
  // Whether `run` may have a directory: it has one already, or fewer than
  // max_runs runs do (it then takes one).
  bool TakeRun(const std::string& run);
  // Whether max_bytes has room left, `needed` bytes more than it holds;
  // logs once when it has not.
  bool BytesLeft(const std::string& run, int64_t needed);

  Metrics* const metrics_;
  const TensorBoardPublisherOptions options_;

  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the thread has closed all
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a job taken from the queue
  bool queue_full_logged_ ABSL_GUARDED_BY(mu_) = false;

  // The thread's alone.
  struct OpenFile {
    std::unique_ptr<TensorBoardWriter> writer;
    int64_t last_write = 0;  // writes_ when it was last written
    // A step added since the last flush: only such a flush tells that the
    // run's file takes its steps again.
    bool unflushed = false;
  };
  absl::flat_hash_map<std::string, OpenFile> writers_;
  int64_t writes_ = 0;
  // Every run given a directory so far; at most max_runs names, kept after
  // eviction so that a returning run keeps its directory.
  absl::flat_hash_set<std::string> runs_;
  bool runs_limit_logged_ = false;
  // Runs failing since their last good flush: each failure is counted, but
  // logged only when its run starts failing, so that a run failing every
  // step (its name lands on a file, a full disk) does not add a log line
  // per step or per flush. Within runs_.
  absl::flat_hash_set<std::string> failing_runs_;
  // What the event files have taken of max_bytes.
  int64_t bytes_ = 0;
  bool bytes_limit_logged_ = false;

  std::thread thread_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_TENSORBOARD_PUBLISHER_H_
