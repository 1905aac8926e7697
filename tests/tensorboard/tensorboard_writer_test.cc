// The event writer, read back with the independent reader in
// event_file_reader.h: framing, both CRCs, the event fields, run-name
// checks and I/O errors.

#include "server/tensorboard/tensorboard_writer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/tensorboard/run_name.h"
#include "tests/tensorboard/event_file_reader.h"

namespace klserve::server {
namespace {

namespace fs = std::filesystem;
using event_reader::ReadEvent;
using event_reader::ReadEventFile;

// 2023-11-14T22:13:20.25Z: a quarter second keeps the double exact.
const absl::Time kWallTime = absl::FromUnixMillis(1700000000250);

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (fs::path(::testing::TempDir()) / "tbwriterXXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  // The writer's events, all of them.
  static std::vector<ReadEvent> ReadBack(const std::string& path) {
    absl::StatusOr<std::vector<ReadEvent>> events = ReadEventFile(path);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *events : std::vector<ReadEvent>{};
  }

  std::unique_ptr<TensorBoardWriter> OpenOrDie(absl::string_view run) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
        TensorBoardWriter::Open(dir_, run);
    EXPECT_TRUE(writer.ok()) << writer.status();
    return writer.ok() ? *std::move(writer) : nullptr;
  }

  std::string dir_;
};

void ExpectScalar(const ReadEvent& e, absl::string_view tag, int64_t step,
                  float value) {
  ASSERT_TRUE(e.summary.has_value());
  ASSERT_EQ(e.summary->size(), 1u);
  EXPECT_FALSE(e.file_version.has_value());
  EXPECT_EQ(e.step, step);
  EXPECT_EQ((*e.summary)[0].tag, tag);
  ASSERT_TRUE((*e.summary)[0].simple_value.has_value()) << tag << " " << step;
  // Bit equality: NaN, -0.0 and inf count too.
  EXPECT_EQ(std::bit_cast<uint32_t>(*(*e.summary)[0].simple_value),
            std::bit_cast<uint32_t>(value))
      << tag << " step " << step << ": got " << *(*e.summary)[0].simple_value
      << ", want " << value;
}

TEST_F(TensorBoardWriterTest, FileVersionFirstThenExactScalars) {
  const absl::Time before = absl::Now();
  auto writer = OpenOrDie("run1");
  ASSERT_NE(writer, nullptr);

  struct Point {
    const char* tag;
    int64_t step;
    double value;
    float want;
  };
  const double kNaN = std::numeric_limits<double>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const std::vector<Point> points = {
      {"loss/kl", 0, 0.0, 0.0f},  // in a oneof, so written although 0
      {"loss/kl", 1, 0.1, 0.1f},
      {"loss/kl", 2, -0.0, -0.0f},
      {"loss/recall", 7, 1.0 / 3.0, static_cast<float>(1.0 / 3.0)},
      {"edge", int64_t{1} << 40, 1e300, kInf},  // past float range
      {"edge", -3, -1e300, -kInf},
      {"edge", std::numeric_limits<int64_t>::max(), kNaN,
       std::numeric_limits<float>::quiet_NaN()},
      {"edge", std::numeric_limits<int64_t>::min(), 1e-45, 1e-45f},
      {"unicode/κλ", 5, 2.5, 2.5f},
  };
  for (const Point& p : points) {
    ASSERT_TRUE(writer
                    ->AddScalar(p.tag, p.step, p.value,
                                kWallTime + absl::Seconds(p.step % 1000))
                    .ok());
  }
  const std::string path = writer->path();
  ASSERT_TRUE(writer->Close().ok());
  const absl::Time after = absl::Now();

  // The name TensorBoard globs for, in <log_dir>/<run>/.
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir_) / "run1");
  const std::regex name(
      R"(events\.out\.tfevents\.(\d+)\.[A-Za-z0-9._-]+\.(\d+)\.(\d+))");
  std::smatch m;
  const std::string file_name = fs::path(path).filename().string();
  ASSERT_TRUE(std::regex_match(file_name, m, name)) << file_name;
  EXPECT_EQ(std::stol(m[2].str()), getpid());
  EXPECT_GE(std::stoll(m[1].str()), absl::ToUnixSeconds(before));
  EXPECT_LE(std::stoll(m[1].str()), absl::ToUnixSeconds(after));

  const std::vector<ReadEvent> events = ReadBack(path);
  ASSERT_EQ(events.size(), 1 + points.size());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_FALSE(events[0].summary.has_value());
  ASSERT_TRUE(events[0].wall_time.has_value());
  EXPECT_GE(*events[0].wall_time, absl::ToUnixMicros(before) / 1e6 - 1e-3);
  EXPECT_LE(*events[0].wall_time, absl::ToUnixMicros(after) / 1e6 + 1e-3);
  for (size_t i = 0; i < points.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectScalar(events[i + 1], points[i].tag, points[i].step, points[i].want);
    EXPECT_EQ(events[i + 1].wall_time,
              1700000000.25 + static_cast<double>(points[i].step % 1000));
  }
}

TEST_F(TensorBoardWriterTest, FlushMakesScalarsReadableWhileOpen) {
  auto writer = OpenOrDie("live");
  ASSERT_NE(writer, nullptr);
  // Open has written the version record already.
  EXPECT_EQ(ReadBack(writer->path()).size(), 1u);
  ASSERT_TRUE(writer->AddScalar("loss", 1, 1.5, kWallTime).ok());
  ASSERT_TRUE(writer->Flush().ok());
  const std::vector<ReadEvent> events = ReadBack(writer->path());
  ASSERT_EQ(events.size(), 2u);
  ExpectScalar(events[1], "loss", 1, 1.5f);
}

TEST_F(TensorBoardWriterTest, DestructorFlushes) {
  std::string path;
  {
    auto writer = OpenOrDie("scoped");
    ASSERT_NE(writer, nullptr);
    path = writer->path();
    ASSERT_TRUE(writer->AddScalar("loss", 3, 0.25, kWallTime).ok());
  }
  const std::vector<ReadEvent> events = ReadBack(path);
  ASSERT_EQ(events.size(), 2u);
  ExpectScalar(events[1], "loss", 3, 0.25f);
}

TEST_F(TensorBoardWriterTest, LargeBufferIsWrittenWithoutFlush) {
  auto writer = OpenOrDie("big");
  ASSERT_NE(writer, nullptr);
  const int kCount = 5000;  // ~50 bytes each, past kFlushBytes
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(writer->AddScalar("loss/kl", i, i * 0.5, kWallTime).ok());
  }
  EXPECT_GE(fs::file_size(writer->path()), TensorBoardWriter::kFlushBytes);
  const std::string path = writer->path();
  ASSERT_TRUE(writer->Close().ok());
  const std::vector<ReadEvent> events = ReadBack(path);
  ASSERT_EQ(events.size(), 1u + kCount);
  for (int i = 0; i < kCount; ++i) {
    ExpectScalar(events[i + 1], "loss/kl", i, static_cast<float>(i * 0.5));
  }
}

// framed_bytes() counts what the file will hold, buffered records included:
// the file's size once flushed.
TEST_F(TensorBoardWriterTest, FramedBytesAreTheFileSizeOnceFlushed) {
  auto writer = OpenOrDie("sized");
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(writer->framed_bytes(),
            static_cast<int64_t>(fs::file_size(writer->path())));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        writer->AddScalar("indexer_loss/layer_7", i, 0.125 * i, kWallTime)
            .ok());
  }
  const int64_t framed = writer->framed_bytes();
  EXPECT_GT(framed, static_cast<int64_t>(fs::file_size(writer->path())));
  const std::string path = writer->path();
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(framed, static_cast<int64_t>(fs::file_size(path)));
}

TEST_F(TensorBoardWriterTest, TwoWritersOfOneRunGetTwoFiles) {
  auto a = OpenOrDie("same");
  auto b = OpenOrDie("same");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->path(), b->path());
  EXPECT_EQ(fs::path(a->path()).parent_path(),
            fs::path(b->path()).parent_path());
}

// TensorBoard reads a run's files in name order: files opened one after
// the other (an evicted run coming back, within one second) sort so. The
// process counts its files: 100 of them cross a power of ten (9 to 10, or
// 99 to 100) wherever the count stood.
TEST_F(TensorBoardWriterTest, FileNamesSortInTheOrderOpened) {
  std::vector<std::string> opened;
  for (int i = 0; i < 100; ++i) {
    auto writer = OpenOrDie("reopened");
    ASSERT_NE(writer, nullptr);
    opened.push_back(fs::path(writer->path()).filename().string());
  }
  std::vector<std::string> sorted = opened;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, opened);
}

TEST_F(TensorBoardWriterTest, ConcurrentAddScalarKeepsEveryRecordWhole) {
  auto writer = OpenOrDie("threads");
  ASSERT_NE(writer, nullptr);
  const int kThreads = 4;
  const int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&writer, t] {
      const std::string tag = absl::StrCat("thread", t);
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(writer->AddScalar(tag, i, t + i, kWallTime).ok());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::string path = writer->path();
  ASSERT_TRUE(writer->Close().ok());

  const std::vector<ReadEvent> events = ReadBack(path);
  ASSERT_EQ(events.size(), 1u + kThreads * kPerThread);
  std::vector<int> next(kThreads, 0);
  for (size_t i = 1; i < events.size(); ++i) {
    const std::string& tag = (*events[i].summary)[0].tag;
    const int t = tag.back() - '0';
    ExpectScalar(events[i], tag, next[t], static_cast<float>(t + next[t]));
    ++next[t];
  }
}

TEST_F(TensorBoardWriterTest, RejectsBadTags) {
  auto writer = OpenOrDie("tags");
  ASSERT_NE(writer, nullptr);
  for (const std::string& tag :
       {std::string(""), std::string("\xff"), std::string("a\xc0\xaf"),
        std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
        std::string("cut\xe2\x82")}) {
    const absl::Status s = writer->AddScalar(tag, 0, 1.0, kWallTime);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("tag"), absl::string_view::npos) << s;
  }
  EXPECT_TRUE(writer->AddScalar("ok/\xe2\x82\xac", 0, 1.0, kWallTime).ok());
  const std::string path = writer->path();
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(ReadBack(path).size(), 2u);
}

TEST_F(TensorBoardWriterTest, CallsAfterCloseFail) {
  auto writer = OpenOrDie("closed");
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_TRUE(writer->Close().ok());
  EXPECT_EQ(writer->AddScalar("loss", 0, 1.0, kWallTime).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer->Flush().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TensorBoardWriterTest, RefusesRunNamesThatCouldEscapeOrCollide) {
  const fs::path log_dir = fs::path(dir_) / "logs";
  for (const std::string& run :
       {std::string("../x"), std::string(".."), std::string("."),
        std::string("../../etc/passwd"), std::string("/abs"),
        std::string("a//b"), std::string("a/"), std::string("a\\b"),
        std::string("\n"), std::string("caf\xc3\xa9"),
        std::string("nul\0byte", 8), std::string(5000, '/'),
        std::string(kMaxRunNameBytes + 1, 'x')}) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
        TensorBoardWriter::Open(log_dir.string(), run);
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument)
        << "run " << run << ": " << writer.status();
  }
  // Refused before anything was created.
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(TensorBoardWriterTest, ASlashMakesASubdirectory) {
  const fs::path log_dir = fs::path(dir_) / "logs";
  // Names that sanitising used to map to one directory get one each.
  for (const std::string& run :
       {std::string("a/b"), std::string("a_b"), std::string("a"),
        std::string(kMaxRunNameBytes, 'x')}) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
        TensorBoardWriter::Open(log_dir.string(), run);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ(fs::canonical((*writer)->path()).parent_path(),
              fs::canonical(log_dir / run));
  }
  std::vector<std::string> top;
  for (const auto& entry : fs::directory_iterator(log_dir)) {
    top.push_back(entry.path().filename().string());
  }
  std::sort(top.begin(), top.end());
  EXPECT_EQ(top, (std::vector<std::string>{
                     "a", "a_b", std::string(kMaxRunNameBytes, 'x')}));
}

TEST_F(TensorBoardWriterTest, EmptyRunIsInvalidArgument) {
  EXPECT_EQ(TensorBoardWriter::Open(dir_, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorBoardWriter::Open("", "run").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TensorBoardWriterTest, CreatesMissingLogDirParents) {
  const fs::path log_dir = fs::path(dir_) / "a" / "b" / "c";
  auto writer = TensorBoardWriter::Open(log_dir.string(), "run");
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE(fs::is_regular_file((*writer)->path()));
}

TEST_F(TensorBoardWriterTest, LogDirUnderAFileIsAnError) {
  const fs::path file = fs::path(dir_) / "plain_file";
  std::ofstream(file) << "x";
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> under =
      TensorBoardWriter::Open((file / "logs").string(), "run");
  EXPECT_FALSE(under.ok());
  EXPECT_NE(under.status().message().find("plain_file"),
            absl::string_view::npos)
      << under.status();
  // log_dir itself a file.
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> itself =
      TensorBoardWriter::Open(file.string(), "run");
  EXPECT_FALSE(itself.ok());
  // The run directory's name taken by a file.
  std::ofstream(fs::path(dir_) / "taken") << "x";
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> taken =
      TensorBoardWriter::Open(dir_, "taken");
  EXPECT_FALSE(taken.ok());
}

TEST_F(TensorBoardWriterTest, UnwritableLogDirIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
      TensorBoardWriter::Open(dir_, "run");
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kPermissionDenied)
      << writer.status();
}

// The file-size limit makes writes fail with EFBIG part-way through a
// buffer, as a full disk would: the error comes back as a Status and the
// file is cut back to whole records, so later writes stay readable.
TEST_F(TensorBoardWriterTest, WriteErrorIsAStatusAndLeavesAReadableFile) {
  auto writer = OpenOrDie("full");
  ASSERT_NE(writer, nullptr);
  const std::string path = writer->path();
  const auto size_after_open = fs::file_size(path);

  rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  int failures = 0;
  for (int i = 0; i < 3000; ++i) {
    if (!writer->AddScalar("lost", i, 1.0, kWallTime).ok()) ++failures;
  }
  if (!writer->Flush().ok()) ++failures;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);

  // ~135 KB of records against a 4 KB limit: at least the 64 KB flushes
  // failed, and whatever failed was cut away again.
  EXPECT_GE(failures, 2);
  EXPECT_LE(fs::file_size(path), small.rlim_cur);
  EXPECT_GE(fs::file_size(path), size_after_open);

  ASSERT_TRUE(writer->AddScalar("kept", 1, 2.0, kWallTime).ok());
  ASSERT_TRUE(writer->Close().ok());
  const std::vector<ReadEvent> events = ReadBack(path);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  ExpectScalar(events.back(), "kept", 1, 2.0f);
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    EXPECT_EQ((*events[i].summary)[0].tag, "lost");
  }
}

}  // namespace
}  // namespace klserve::server
