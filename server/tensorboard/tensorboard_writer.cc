#include "server/tensorboard/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/utf8.h"
#include "server/tensorboard/crc32c.h"
#include "server/tensorboard/run_name.h"

namespace klserve::server {
namespace {

// The float cast in AddScalar relies on IEEE overflow to infinity.
static_assert(std::numeric_limits<float>::is_iec559);
static_assert(std::numeric_limits<double>::is_iec559);

// The protobuf wire format, just the parts tensorboard.Event needs.
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kBytes = 2,
  kFixed32 = 5
};

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

void PutTag(std::string* out, uint32_t field, WireType type) {
  PutVarint(out, (uint64_t{field} << 3) | type);
}

void PutBytesField(std::string* out, uint32_t field, absl::string_view bytes) {
  PutTag(out, field, kBytes);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Field numbers from tensorboard/compat/proto/event.proto and summary.proto
// (the same as tensorflow/core/util/event.proto).
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string, oneof what
constexpr uint32_t kEventSummary = 5;      // Summary, oneof what
constexpr uint32_t kSummaryValue = 1;      // repeated Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float, oneof value

// Seconds since the epoch. absl::ToDoubleSeconds(t - UnixEpoch()) is off by
// up to ~2e-7 s here (1700000000.25 came out as 1700000000.2499998); whole
// microseconds fit a double exactly and one division rounds them correctly.
double UnixSecondsAsDouble(absl::Time t) {
  return static_cast<double>(absl::ToUnixMicros(t)) / 1e6;
}

void PutWallTime(std::string* out, absl::Time wall_time) {
  PutTag(out, kEventWallTime, kFixed64);
  PutLittleEndian(out, std::bit_cast<uint64_t>(UnixSecondsAsDouble(wall_time)),
                  8);
}

std::string FileVersionEvent(absl::Time wall_time) {
  std::string event;
  PutWallTime(&event, wall_time);
  PutBytesField(&event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string ScalarEvent(absl::string_view tag, int64_t step, float value,
                        absl::Time wall_time) {
  std::string summary_value;
  PutBytesField(&summary_value, kValueTag, tag);
  // simple_value sits in a oneof, so it is written even when 0: without it
  // the reader would see a Value that holds nothing.
  PutTag(&summary_value, kValueSimpleValue, kFixed32);
  PutLittleEndian(&summary_value, std::bit_cast<uint32_t>(value), 4);

  std::string summary;
  PutBytesField(&summary, kSummaryValue, summary_value);

  std::string event;
  PutWallTime(&event, wall_time);
  PutTag(&event, kEventStep, kVarint);
  PutVarint(&event, static_cast<uint64_t>(step));  // int64: two's complement
  PutBytesField(&event, kEventSummary, summary);
  return event;
}

std::string HostnameForFileName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') {
    return "localhost";
  }
  std::string host(buf);
  for (char& c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
    if (!ok) c = '_';
  }
  return host;
}

absl::Status CreateDirectories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::ErrnoToStatus(
        ec.value(),
        absl::StrCat("tensorboard: cannot create directory ", dir.string()));
  }
  // create_directories reports success when the path exists as a file.
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensorboard: ", dir.string(), " exists and is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TensorBoardWriter::PrepareLogDirectory(
    const std::string& log_dir) {
  if (log_dir.empty()) {
    return absl::InvalidArgumentError("tensorboard log_dir: must not be empty");
  }
  if (absl::Status created = CreateDirectories(log_dir); !created.ok()) {
    return created;
  }
  if (access(log_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("tensorboard: cannot make files in ", log_dir));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(
    const std::string& log_dir, absl::string_view run) {
  if (log_dir.empty()) {
    return absl::InvalidArgumentError("tensorboard log_dir: must not be empty");
  }
  if (absl::Status s = CheckRunName(run, "tensorboard run"); !s.ok()) {
    return s;
  }
  // CheckRunName leaves only relative paths without "." or ".." parts.
  const std::filesystem::path run_dir =
      std::filesystem::path(log_dir) / std::string(run);
  if (absl::Status s = CreateDirectories(run_dir); !s.ok()) return s;

  // The counter keeps two writers opened by this process in the same second
  // apart; O_EXCL makes sure no file is ever taken over, whoever made it.
  static std::atomic<int64_t> counter{0};
  const absl::Time now = absl::Now();
  const std::string prefix =
      absl::StrCat("events.out.tfevents.", absl::ToUnixSeconds(now), ".",
                   HostnameForFileName(), ".", getpid(), ".");
  std::string path;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    // Zero-padded: TensorBoard reads a run's files in name order, and .10
    // would come before .2.
    path = (run_dir / absl::StrCat(prefix, absl::Dec(counter.fetch_add(1),
                                                     absl::kZeroPad10)))
               .string();
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST && errno != EINTR) break;
  }
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("tensorboard: cannot create ", path));
  }
  std::unique_ptr<TensorBoardWriter> writer(
      new TensorBoardWriter(std::move(path), fd));
  // Written at once, so a file that exists is a valid event file and a
  // broken disk shows up here rather than at the first scalar.
  absl::Status status;
  {
    absl::MutexLock lock(&writer->mu_);
    writer->AppendRecordLocked(FileVersionEvent(now));
    status = writer->FlushLocked();
  }
  if (!status.ok()) {
    unlink(writer->path_.c_str());  // no half-made files left behind
    return status;
  }
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { Close().IgnoreError(); }

absl::Status TensorBoardWriter::AddScalar(absl::string_view tag, int64_t step,
                                          double value, absl::Time wall_time) {
  if (tag.empty()) {
    return absl::InvalidArgumentError("tensorboard tag: must not be empty");
  }
  if (!IsUtf8(tag)) {
    return absl::InvalidArgumentError("tensorboard tag: must be valid UTF-8");
  }
  const std::string event =
      ScalarEvent(tag, step, static_cast<float>(value), wall_time);
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensorboard: ", path_, " is closed"));
  }
  AppendRecordLocked(event);
  if (buffer_.size() >= kFlushBytes ||
      absl::Now() - last_write_ >= kFlushInterval) {
    return FlushLocked();
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::Flush() {
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensorboard: ", path_, " is closed"));
  }
  return FlushLocked();
}

absl::Status TensorBoardWriter::Close() {
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) return absl::OkStatus();
  absl::Status status = FlushLocked();
  // Linux releases the descriptor even when close fails, so no retry.
  if (close(fd_) != 0 && status.ok()) {
    status = absl::ErrnoToStatus(errno,
                                 absl::StrCat("tensorboard: closing ", path_));
  }
  fd_ = -1;
  return status;
}

void TensorBoardWriter::AppendRecordLocked(absl::string_view event) {
  // TFRecord: uint64 length, masked CRC of those 8 bytes, the data, masked
  // CRC of the data; all little-endian.
  std::string header;
  PutLittleEndian(&header, event.size(), 8);
  PutLittleEndian(&header, MaskedCrc32c(header), 4);
  buffer_ += header;
  buffer_.append(event.data(), event.size());
  PutLittleEndian(&buffer_, MaskedCrc32c(event), 4);
  framed_bytes_ += static_cast<int64_t>(header.size() + event.size() + 4);
}

absl::Status TensorBoardWriter::FlushLocked() {
  last_write_ = absl::Now();
  if (truncate_pending_) {
    if (ftruncate(fd_, file_size_) != 0) {
      const int err = errno;
      const size_t dropped = buffer_.size();
      buffer_.clear();
      return absl::ErrnoToStatus(
          err, absl::StrCat("tensorboard: cutting ", path_,
                            " back to its last whole record (", dropped,
                            " buffered bytes dropped)"));
    }
    truncate_pending_ = false;
  }
  size_t done = 0;
  int err = 0;
  while (done < buffer_.size()) {
    const ssize_t n = pwrite(fd_, buffer_.data() + done, buffer_.size() - done,
                             file_size_ + static_cast<int64_t>(done));
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      err = n < 0 ? errno : EIO;
      break;
    }
  }
  if (err == 0) {
    file_size_ += static_cast<int64_t>(done);
    buffer_.clear();
    return absl::OkStatus();
  }
  // A torn record would end the reader's pass over the file, and anything
  // appended after it would be unreadable, so cut it off (now, or before
  // the next write if that fails too).
  if (done > 0 && ftruncate(fd_, file_size_) != 0) truncate_pending_ = true;
  const size_t dropped = buffer_.size();
  buffer_.clear();
  return absl::ErrnoToStatus(
      err, absl::StrCat("tensorboard: writing ", path_, " (", dropped,
                        " buffered bytes dropped)"));
}

}  // namespace klserve::server
