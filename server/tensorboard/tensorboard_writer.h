#ifndef KLSERVE_SERVER_TENSORBOARD_TENSORBOARD_WRITER_H_
#define KLSERVE_SERVER_TENSORBOARD_TENSORBOARD_WRITER_H_

// Writes scalars as a TensorBoard event file: TFRecord framing around
// hand-encoded tensorboard.Event protos, so this library needs neither
// protobuf nor gRPC.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace klserve::server {

// One event file of one run. TensorBoard shows each subdirectory of the log
// directory as a run, so `Open(log_dir, "exp1")` writes
// `<log_dir>/exp1/events.out.tfevents.<unix seconds>.<host>.<pid>.<n>`, n
// counting the files this process opened, in ten digits, so that names
// sort in the order the files were opened.
//
// Thread-safe: one internal mutex serialises all calls, and a call that
// writes holds it for the write (to the page cache, about kFlushBytes), so
// keep it off latency-critical threads. Records are buffered in memory;
// AddScalar writes the buffer out when it passes kFlushBytes or when
// kFlushInterval has passed since the last write, so that a live TensorBoard
// keeps up; Flush writes it now. Nothing is fsync'ed.
//
// Errors never abort: every failure is a Status. After a failed write the
// file is cut back to its last whole record, so it stays readable, and the
// records that were buffered are dropped; later calls try again.
class TensorBoardWriter {
 public:
  static constexpr size_t kFlushBytes = 64 * 1024;
  static constexpr absl::Duration kFlushInterval = absl::Seconds(2);

  // Creates `log_dir` (and its parents) if needed, the run's directory
  // `<log_dir>/<run>` and a new event file, and writes the file_version
  // record ("brain.Event:2"). `run` must pass CheckRunName (run_name.h), so
  // distinct runs get distinct directories and none escapes log_dir; a `/` in
  // it makes subdirectories, which TensorBoard shows as the run "a/b".
  // INVALID_ARGUMENT for an empty log_dir or a run CheckRunName refuses;
  // FAILED_PRECONDITION when a directory on the way is a file; otherwise the
  // failed mkdir/open/write's errno as a Status naming the path
  // (PERMISSION_DENIED, ...).
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(
      const std::string& log_dir, absl::string_view run);

  // Creates `log_dir` (and its parents) if needed and checks that this
  // process may make files in it, so that a server refuses a directory it
  // cannot use when it starts, not at its first step. Errors as Open's.
  static absl::Status PrepareLogDirectory(const std::string& log_dir);

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Flushes and closes; a failure here is lost, so call Close() first when
  // it matters.
  ~TensorBoardWriter();

  // Appends one scalar event: `tag` (non-empty, valid UTF-8, else
  // INVALID_ARGUMENT) at `step`, recorded as float32 (TensorBoard's
  // simple_value; doubles outside float range become +-inf), stamped with
  // `wall_time`. May write (see the class comment); a write error is
  // returned and that buffer is dropped. FAILED_PRECONDITION after Close.
  absl::Status AddScalar(absl::string_view tag, int64_t step, double value,
                         absl::Time wall_time);

  // Writes every buffered record to the file; on error they are dropped
  // (see the class comment). FAILED_PRECONDITION after Close.
  absl::Status Flush();

  // Flushes and closes the file; the first call returns the flush or close
  // error, later calls return OK.
  absl::Status Close();

  // The event file's full path.
  const std::string& path() const { return path_; }

  // Bytes of every record framed since Open, the file_version record
  // included, whether written yet or not, and whether a failed write later
  // dropped them: what this writer has asked of the disk, for callers that
  // bound the disk space their files take.
  int64_t framed_bytes() const {
    absl::MutexLock lock(&mu_);
    return framed_bytes_;
  }

 private:
  TensorBoardWriter(std::string path, int fd)
      : path_(std::move(path)), fd_(fd) {}

  // Frames `event` (a serialised Event) as one TFRecord into buffer_.
  void AppendRecordLocked(absl::string_view event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);  // -1 once closed
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  int64_t framed_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of whole records in the file; writes go here with pwrite, and a
  // failed write is cut back to it.
  int64_t file_size_ ABSL_GUARDED_BY(mu_) = 0;
  // A failed write's cut-back failed too; retried before the next write.
  bool truncate_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_write_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_TENSORBOARD_TENSORBOARD_WRITER_H_
