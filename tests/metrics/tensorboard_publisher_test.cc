// The event files are written on a thread of their own: a request that
// publishes a step never waits for the disk. The test stalls that real thread
// (a signal handler that blocks, as a write to a stalled network volume
// would) and checks that requests go on, that the steps past
// --max_tensorboard_queued_steps are counted as skipped, and that the ones
// queued reach the file, in order, once the thread goes on.

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "server/metrics/loss_reporter.h"
#include "tests/metrics/metrics_without_port.h"
#include "tests/tensorboard/event_file_reader.h"

namespace klserve::server {
namespace {

std::atomic<bool> stalled{false};
std::atomic<bool> released{false};

// Runs on the writing thread: blocks it where it waits for work, until the
// test releases it. Only async-signal-safe calls.
void StallUntilReleased(int) {
  stalled.store(true);
  const timespec pause = {0, 1000000};
  while (!released.load()) nanosleep(&pause, nullptr);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  return text;
}

// The id of this process's thread named `name`, if there is one.
std::optional<pid_t> ThreadNamed(absl::string_view name) {
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    const std::string comm = ReadFile(entry.path() / "comm");
    if (absl::StripSuffix(comm, "\n") == name) {
      int tid = 0;
      if (absl::SimpleAtoi(entry.path().filename().string(), &tid)) return tid;
    }
  }
  return std::nullopt;
}

// Whether thread `tid` is asleep in futex(2): waiting for work with its
// lock released.
bool WaitsInFutex(pid_t tid) {
  const std::string syscall =
      ReadFile(absl::StrCat("/proc/self/task/", tid, "/syscall"));
  const std::vector<std::string> fields = absl::StrSplit(syscall, ' ');
  int number = -1;
  return absl::SimpleAtoi(fields[0], &number) && number == SYS_futex;
}

// Waits until the writing thread sleeps waiting for work (seen asleep 20
// times over 100 ms running), so that it holds no lock.
void WaitUntilTheWritingThreadIsIdle(pid_t writer) {
  int asleep = 0;
  for (int i = 0; i < 5000 && asleep < 20; ++i) {
    asleep = WaitsInFutex(writer) ? asleep + 1 : 0;
    usleep(5000);
  }
  ASSERT_EQ(asleep, 20) << "the writing thread never waited for work";
}

// Stalls the writing thread where it waits for work, until `released`.
void StallTheWritingThread() {
  std::optional<pid_t> writer;
  for (int i = 0; i < 1000 && !(writer = ThreadNamed("klserve-tboard")); ++i) {
    usleep(1000);
  }
  ASSERT_TRUE(writer.has_value()) << "no thread named klserve-tboard";
  ASSERT_NO_FATAL_FAILURE(WaitUntilTheWritingThreadIsIdle(*writer));
  stalled.store(false);
  released.store(false);
  struct sigaction action = {};
  action.sa_handler = StallUntilReleased;
  ASSERT_EQ(sigaction(SIGUSR1, &action, nullptr), 0);
  ASSERT_EQ(syscall(SYS_tgkill, getpid(), *writer, SIGUSR1), 0);
  while (!stalled.load()) usleep(1000);
}

// The files under `dir` this process holds open.
int OpenFilesUnder(const std::string& dir) {
  int open = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::filesystem::path target =
        std::filesystem::read_symlink(entry.path(), error);
    if (!error && absl::StartsWith(target.string(), dir + "/")) ++open;
  }
  return open;
}

// An empty directory of its own under the test's temporary directory.
std::string FreshDirectory(absl::string_view name) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           absl::StrCat(name, "_", getpid()))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The value of the unlabelled sample `name` in an exposition.
double SampleValue(const std::string& exposition, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, " ")) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
  }
  ADD_FAILURE() << name << " not in the exposition";
  return -1;
}

// Adds a sample of `result` to `run`'s step `step`, untagged by layer.
absl::Status AddSample(LossReporter& reporter, const std::string& run,
                       int64_t step, const IndexerKlResult& result) {
  return reporter.Add({.run = run,
                       .step = step,
                       .layer = std::nullopt,
                       .microbatch = std::nullopt},
                      result, 1.0);
}

TEST(TensorBoardPublisherTest, RequestsGoOnWhileTheWritingThreadIsStalled) {
  const std::string dir = FreshDirectory("stalled_tensorboard");

  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);

  constexpr int kQueued = 8;
  constexpr int kSteps = 100;
  LossReporterOptions options;
  options.tensorboard.dir = dir;
  options.tensorboard.max_queued = kQueued;
  // No flush while stalled, so the thread sleeps until the steps come.
  options.tensorboard.flush_interval = absl::Hours(1);
  auto reporter = std::make_unique<LossReporter>(metrics.get(), options);

  ASSERT_NO_FATAL_FAILURE(StallTheWritingThread());

  // Each step of the run publishes the one before it: kSteps - 1 steps.
  IndexerKlResult result;
  result.denominator = 1;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < kSteps; ++step) {
    result.kl_sum = static_cast<double>(step);
    ASSERT_TRUE(AddSample(*reporter, "stalled", step, result).ok());
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(10));
  const std::string exposition = metrics->Scrape();
  EXPECT_TRUE(absl::StrContains(
      exposition, "klserve_indexer_last_step{run=\"stalled\"} 98"))
      << exposition;
  EXPECT_EQ(SampleValue(exposition, "klserve_tensorboard_skipped_steps_total"),
            kSteps - 1 - kQueued);

  // Once the thread has drained the queue, the shutdown publishes the last
  // step, which now fits. Shutting down before that would race the thread
  // for the queue's room, and step 99 would be written or skipped by chance.
  released.store(true);
  std::optional<pid_t> writer = ThreadNamed("klserve-tboard");
  ASSERT_TRUE(writer.has_value());
  ASSERT_NO_FATAL_FAILURE(WaitUntilTheWritingThreadIsIdle(*writer));
  reporter->Shutdown();
  EXPECT_EQ(
      SampleValue(metrics->Scrape(), "klserve_tensorboard_skipped_steps_total"),
      kSteps - 1 - kQueued);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(dir) / "stalled")) {
    files.push_back(entry.path().string());
  }
  ASSERT_EQ(files.size(), 1u);
  absl::StatusOr<std::vector<event_reader::ReadEvent>> events =
      event_reader::ReadEventFile(files[0]);
  ASSERT_TRUE(events.ok()) << events.status();
  std::vector<int64_t> steps;
  for (const event_reader::ReadEvent& event : *events) {
    if (!event.summary) continue;
    ASSERT_EQ(event.summary->size(), 1u);
    EXPECT_EQ((*event.summary)[0].tag, "indexer_loss");
    EXPECT_EQ((*event.summary)[0].simple_value,
              static_cast<float>(event.step.value_or(-1)));
    steps.push_back(event.step.value_or(-1));
  }
  EXPECT_EQ(steps, std::vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 99}));
  std::filesystem::remove_all(dir);
}

// Evictions skipped at a full queue used to leave their runs' files open:
// with the disk stalled now and then, open files grew by the queue's worth
// each time, past --max_runs and up to --max_tensorboard_runs (a helper ran
// a server out of descriptors). The files written least recently now close
// as others open, so no more than --max_runs stay open.
TEST(TensorBoardPublisherTest, EvictionsSkippedAtAFullQueueLeaveFilesBounded) {
  const std::string dir = FreshDirectory("evicted_tensorboard");
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporterOptions options;
  options.steps.max_runs = 2;
  options.tensorboard.dir = dir;
  options.tensorboard.max_queued = 4;
  options.tensorboard.flush_interval = absl::Hours(1);
  LossReporter reporter(metrics.get(), options);
  IndexerKlResult result;
  result.kl_sum = 1;
  result.denominator = 1;
  // Each run's second step publishes its first; each new run evicts one.
  const auto run_steps = [&](const std::string& run) {
    for (int64_t step = 0; step < 2; ++step) {
      ASSERT_TRUE(AddSample(reporter, run, step, result).ok());
    }
  };
  for (int cycle = 0; cycle < 3; ++cycle) {
    ASSERT_NO_FATAL_FAILURE(StallTheWritingThread());
    for (int i = 0; i < 8; ++i) {
      ASSERT_NO_FATAL_FAILURE(run_steps(absl::StrCat("c", cycle, "r", i)));
    }
    released.store(true);
    std::optional<pid_t> writer = ThreadNamed("klserve-tboard");
    ASSERT_TRUE(writer.has_value());
    ASSERT_NO_FATAL_FAILURE(WaitUntilTheWritingThreadIsIdle(*writer));
    EXPECT_LE(OpenFilesUnder(dir), options.steps.max_runs)
        << "after cycle " << cycle;
  }
  reporter.Shutdown();
  EXPECT_EQ(OpenFilesUnder(dir), 0);
  std::filesystem::remove_all(dir);
}

// The lines of `log` that contain `text`.
int LinesNaming(const std::string& log, absl::string_view text) {
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    lines += absl::StrContains(line, text);
  }
  return lines;
}

// A run whose directory cannot be made (its name lands on a file) fails on
// every step: each failure is counted, but only the first is logged until
// the run writes again (a helper grew the log by a line per request).
TEST(TensorBoardPublisherTest, ARunFailingEveryStepIsLoggedOnceUntilItWrites) {
  const std::string dir = FreshDirectory("failing_tensorboard");
  std::ofstream(std::filesystem::path(dir) / "taken") << "a file";
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporterOptions options;
  options.tensorboard.dir = dir;
  IndexerKlResult result;
  result.kl_sum = 1;
  result.denominator = 1;
  ::testing::internal::CaptureStderr();
  auto reporter = std::make_unique<LossReporter>(metrics.get(), options);
  // Steps 0 to 5 fail (the step after each publishes it, and the last is
  // published at shutdown); a good run in between fails nothing.
  for (int64_t step = 0; step < 6; ++step) {
    ASSERT_TRUE(AddSample(*reporter, "taken/run", step, result).ok());
    ASSERT_TRUE(AddSample(*reporter, "good", step, result).ok());
  }
  reporter->Shutdown();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(LinesNaming(log, "run \"taken/run\""), 1) << log;
  EXPECT_EQ(
      SampleValue(metrics->Scrape(), "klserve_tensorboard_write_errors_total"),
      6);
  std::filesystem::remove_all(dir);
}

// What the process writes to stderr, through a pipe: gtest's capture goes
// to a file, which a file-size limit would cut short.
class StderrThroughPipe {
 public:
  StderrThroughPipe() {
    int fds[2];
    if (pipe(fds) != 0) return;
    std::fflush(stderr);
    saved_ = dup(2);
    dup2(fds[1], 2);
    close(fds[1]);
    reader_ = std::thread([this, in = fds[0]] {
      char buffer[4096];
      for (ssize_t n; (n = read(in, buffer, sizeof(buffer))) > 0;) {
        text_.append(buffer, n);
      }
      close(in);
    });
  }
  ~StderrThroughPipe() {
    if (reader_.joinable()) Finish();
  }
  // Everything written since the start; stderr is itself again.
  std::string Finish() {
    std::fflush(stderr);
    dup2(saved_, 2);  // the pipe's last writer closes: the reader ends
    close(saved_);
    reader_.join();
    return text_;
  }

 private:
  int saved_ = -1;
  std::thread reader_;
  std::string text_;
};

// A disk that fills up (here a file-size limit past each file's first
// record): every flush of the run fails, each is counted, and one line is
// logged for them all (a helper saw a line per run per second). The run
// keeps its file rather than starting one per failure.
TEST(TensorBoardPublisherTest, FlushesFailingOnAFullDiskAreLoggedOnce) {
  const std::string dir = FreshDirectory("full_tensorboard");
  std::unique_ptr<Metrics> metrics = MetricsWithoutPort();
  ASSERT_NE(metrics, nullptr);
  LossReporterOptions options;
  options.tensorboard.dir = dir;
  options.tensorboard.flush_interval = absl::Milliseconds(1);
  IndexerKlResult result;
  result.kl_sum = 1;
  result.denominator = 1;
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  // Past the limit a write fails with EFBIG instead of raising SIGXFSZ.
  const sighandler_t xfsz = signal(SIGXFSZ, SIG_IGN);
  rlimit small = before;
  small.rlim_cur = 40;  // the file's first record (its version), not a step's
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  StderrThroughPipe captured;
  auto reporter = std::make_unique<LossReporter>(metrics.get(), options);
  for (int64_t step = 0; step < 6; ++step) {
    EXPECT_TRUE(AddSample(*reporter, "full", step, result).ok());
    absl::SleepFor(absl::Milliseconds(30));  // flushed in between
  }
  reporter->Shutdown();
  const std::string log = captured.Finish();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  signal(SIGXFSZ, xfsz);
  EXPECT_EQ(LinesNaming(log, "run \"full\""), 1) << log;
  EXPECT_GE(
      SampleValue(metrics->Scrape(), "klserve_tensorboard_write_errors_total"),
      6);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(dir) / "full")) {
    files += entry.is_regular_file();
  }
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace klserve::server
