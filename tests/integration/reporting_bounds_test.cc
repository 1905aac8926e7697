// The bounds on what a caller can make the loss reporting hold (security
// review, issue 12), against the real server:
// - tags.layer outside [0, --max_layers_per_run) is refused before
//   computing, and counted nowhere;
// - at most --max_tensorboard_runs runs get a TensorBoard directory; later
//   runs keep their Prometheus series, and no directory is deleted (an
//   evicted run that comes back writes into its own directory again);
// - the event files take at most --max_tensorboard_bytes (and one step);
//   later steps keep their Prometheus series;
// - run names are checked, not rewritten: a name outside the alphabet is
//   refused, and names that sanitising used to merge ("dir/x", "dir_x") get
//   a series and a directory each;
// - clients that connect to /metrics and send half a request stall no
//   scrape.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/integration/harness.h"
#include "tests/tensorboard/event_file_reader.h"

namespace klserve::integration {
namespace {

namespace fs = std::filesystem;

// A server whose /metrics port the test knows.
struct Reporting {
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<Client> client;
  int metrics_port = 0;
};

std::optional<Reporting> StartReporting(std::vector<std::string> flags) {
  Reporting r;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(flags);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return std::nullopt;
  }
  r.server = *std::move(server);
  r.metrics_port = r.server->metrics_port();
  r.client = MakeClient(r.server->target());
  return r;
}

bool SendAll(int fd, absl::string_view bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(bytes.size());
}

// Whether a sample line `series value` is in the exposition.
bool HasSample(const std::string& exposition, absl::string_view series,
               absl::string_view value) {
  return absl::StrContains(exposition, absl::StrCat("\n", series, " ", value));
}

v1::ComputeLossRequest TaggedRequest(const std::string& run, int64_t step,
                                     std::optional<int32_t> layer) {
  ProblemSpec spec;
  spec.name = "tagged";
  spec.B = 1, spec.T = 4, spec.S = 8, spec.H = 2;
  v1::ComputeLossRequest request = MakeRequest(spec);
  request.mutable_tags()->set_run(run);
  request.mutable_tags()->set_step(step);
  if (layer.has_value()) request.mutable_tags()->set_layer(*layer);
  return request;
}

std::string MakeTempDir() {
  std::string templ = "/tmp/klserve_bounds_XXXXXX";
  char* dir = mkdtemp(templ.data());
  return dir == nullptr ? "" : std::string(dir);
}

// The names directly under `dir`.
std::set<std::string> Entries(const fs::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// The steps of the indexer_loss scalars in the event files directly in
// `run_dir`, and how many files there are.
struct RunEvents {
  int files = 0;
  std::set<int64_t> steps;
  std::vector<double> loss_wall_times;  // of the indexer_loss points
};
RunEvents ReadRun(const fs::path& run_dir) {
  RunEvents out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    if (!entry.is_regular_file()) continue;
    ++out.files;
    absl::StatusOr<std::vector<event_reader::ReadEvent>> events =
        event_reader::ReadEventFile(entry.path().string());
    EXPECT_TRUE(events.ok()) << entry.path() << ": " << events.status();
    if (!events.ok()) continue;
    for (const event_reader::ReadEvent& e : *events) {
      if (!e.summary.has_value() || !e.step.has_value()) continue;
      for (const event_reader::ReadValue& v : *e.summary) {
        if (v.tag != "indexer_loss") continue;
        out.steps.insert(*e.step);
        if (e.wall_time.has_value()) {
          out.loss_wall_times.push_back(*e.wall_time);
        }
      }
    }
  }
  return out;
}

// SIGTERM, and the exit that publishes and closes every event file.
void DrainAndExit(ServerProcess& server) {
  server.Signal(SIGTERM);
  const std::optional<int> status = server.WaitForExit(absl::Seconds(15));
  ASSERT_TRUE(status.has_value()) << "still running 15 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server.Log();
}

// ---------------------------------------------------------------------------
// --max_layers_per_run

TEST(LayerBoundTest, LayersOutsideTheBoundAreRefusedBeforeComputing) {
  std::optional<Reporting> r = StartReporting({"--max_layers_per_run=4"});
  ASSERT_TRUE(r.has_value());
  const v1::ComputeLossRequest inside = TaggedRequest("layers", 1, 3);
  ASSERT_TRUE(r->client->ComputeLossUnary(inside).ok());

  for (const int32_t layer : {4, 2000, -1}) {
    SCOPED_TRACE(absl::StrCat("layer ", layer));
    const v1::ComputeLossRequest request = TaggedRequest("layers", 1, layer);
    for (const bool stream : {false, true}) {
      absl::StatusOr<v1::ComputeLossResponse> refused =
          stream ? r->client->ComputeLossStreaming(request, 2)
                 : r->client->ComputeLossUnary(request);
      ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
          << Describe(refused.status());
      const absl::string_view message = refused.status().message();
      EXPECT_TRUE(absl::StrContains(message, "tags.layer")) << message;
      EXPECT_TRUE(absl::StrContains(message, "[0, 4)")) << message;
      EXPECT_TRUE(absl::StrContains(message, "--max_layers_per_run"))
          << message;
    }
  }

  // Counted nowhere: the step holds the one request inside the bound, no
  // rows were computed for the refused ones, and no series names them.
  absl::StatusOr<v1::FinishStepResponse> step =
      r->client->FinishStep("layers", 1);
  ASSERT_TRUE(step.ok()) << Describe(step.status());
  EXPECT_EQ(step->requests(), 1);
  const std::string exposition = ScrapeMetrics(r->metrics_port);
  EXPECT_TRUE(HasSample(exposition, "klserve_rows_computed_total", "4"))
      << exposition;
  EXPECT_TRUE(absl::StrContains(
      exposition, "klserve_indexer_loss{layer=\"3\",run=\"layers\"}"))
      << exposition;
  for (const char* layer : {"4", "2000", "-1"}) {
    EXPECT_FALSE(
        absl::StrContains(exposition, absl::StrCat("layer=\"", layer, "\"")))
        << exposition;
  }
}

TEST(LayerBoundTest, ANonPositiveBoundDoesNotStart) {
  const CommandResult result =
      RunCommand({KLSERVE_BIN, "--listen=127.0.0.1:0",
                  "--metrics_listen=", "--max_layers_per_run=0"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(result.err, "--max_layers_per_run"))
      << result.err;
}

// One request of `run` at `step`, layer 0, and the step finished.
void FinishOneStep(Reporting& r, const std::string& run, int64_t step) {
  ASSERT_TRUE(r.client->ComputeLossUnary(TaggedRequest(run, step, 0)).ok());
  ASSERT_TRUE(r.client->FinishStep(run, step).ok()) << run;
}

// `skipped` steps left out of TensorBoard by a bound, none by an error. The
// event files' thread counts them after the requests that published them
// have returned: waited for, up to 10 s.
void ExpectSkippedStepsWithoutErrors(int metrics_port,
                                     const std::string& skipped) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  std::string exposition = ScrapeMetrics(metrics_port);
  while (!HasSample(exposition, "klserve_tensorboard_skipped_steps_total",
                    skipped) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    exposition = ScrapeMetrics(metrics_port);
  }
  EXPECT_TRUE(
      HasSample(exposition, "klserve_tensorboard_skipped_steps_total", skipped))
      << exposition;
  EXPECT_TRUE(
      HasSample(exposition, "klserve_tensorboard_write_errors_total", "0"))
      << exposition;
}

// The log names `flag` once, however often its bound was met.
void ExpectSaidOnce(const std::string& log, const std::string& flag) {
  const size_t said = log.find(flag);
  ASSERT_NE(said, std::string::npos) << log;
  EXPECT_EQ(log.find(flag, said + 1), std::string::npos) << log;
}

// ---------------------------------------------------------------------------
// --max_tensorboard_runs

TEST(TensorBoardBoundTest, RunsPastTheBoundGetMetricsButNoDirectory) {
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  // --max_runs=2 evicts "a" when "c" arrives: its directory must stay, and
  // it must get it back when it returns.
  std::optional<Reporting> r =
      StartReporting({"--tensorboard_dir=" + tb_dir, "--max_runs=2",
                      "--max_tensorboard_runs=2"});
  ASSERT_TRUE(r.has_value());
  for (const char* run : {"a", "b", "c", "d"}) FinishOneStep(*r, run, 1);
  FinishOneStep(*r, "a", 2);

  // Prometheus has every run that is still tracked, past the bound or not.
  const std::string exposition = ScrapeMetrics(r->metrics_port);
  EXPECT_TRUE(
      HasSample(exposition, "klserve_indexer_last_step{run=\"a\"}", "2"))
      << exposition;
  EXPECT_TRUE(
      HasSample(exposition, "klserve_indexer_last_step{run=\"d\"}", "1"))
      << exposition;
  // c and d: one skipped step each.
  ExpectSkippedStepsWithoutErrors(r->metrics_port, "2");

  ASSERT_NO_FATAL_FAILURE(DrainAndExit(*r->server));
  EXPECT_EQ(Entries(tb_dir), (std::set<std::string>{"a", "b"}));
  // "a" was evicted between its steps: two event files, both whole.
  const RunEvents a = ReadRun(fs::path(tb_dir) / "a");
  EXPECT_EQ(a.files, 2);
  EXPECT_EQ(a.steps, (std::set<int64_t>{1, 2}));
  EXPECT_EQ(ReadRun(fs::path(tb_dir) / "b").steps, (std::set<int64_t>{1}));
  // Said once, whatever the number of runs past the bound.
  ExpectSaidOnce(r->server->Log(), "--max_tensorboard_runs");
  fs::remove_all(tb_dir);
}

// ---------------------------------------------------------------------------
// --max_tensorboard_bytes

TEST(TensorBoardBoundTest, StepsPastTheByteBoundGetMetricsButNoEvent) {
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  // The directory and event file of "a" take 8192 bytes, past the 4097:
  // its first step is written whole, and nothing after it, from "a" or
  // from a new run, whatever its size.
  std::optional<Reporting> r = StartReporting(
      {"--tensorboard_dir=" + tb_dir, "--max_tensorboard_bytes=4097"});
  ASSERT_TRUE(r.has_value());
  FinishOneStep(*r, "a", 1);
  FinishOneStep(*r, "a", 2);
  FinishOneStep(*r, "b", 1);
  FinishOneStep(*r, "a", 3);

  const std::string exposition = ScrapeMetrics(r->metrics_port);
  EXPECT_TRUE(
      HasSample(exposition, "klserve_indexer_last_step{run=\"a\"}", "3"))
      << exposition;
  EXPECT_TRUE(
      HasSample(exposition, "klserve_indexer_last_step{run=\"b\"}", "1"))
      << exposition;
  ExpectSkippedStepsWithoutErrors(r->metrics_port, "3");

  ASSERT_NO_FATAL_FAILURE(DrainAndExit(*r->server));
  EXPECT_EQ(Entries(tb_dir), (std::set<std::string>{"a"}));
  const RunEvents a = ReadRun(fs::path(tb_dir) / "a");
  EXPECT_EQ(a.files, 1);
  EXPECT_EQ(a.steps, (std::set<int64_t>{1}));
  ExpectSaidOnce(r->server->Log(), "--max_tensorboard_bytes");
  fs::remove_all(tb_dir);
}

// A run's name makes a directory per part, up to 64 of them, which take
// disk blocks as files do: they count against the bound, 4 KiB each, and
// a new run whose directories would pass it gets none. Before, eight names
// of 64 parts made 2 MiB of directories past a 1 MiB bound.
TEST(TensorBoardBoundTest, ARunsDirectoriesCountAgainstTheBound) {
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  // "a/b" takes two directories and a file, 12 KiB and its records, of the
  // 16; "c/d" would take two directories more, and so would a name of 64
  // parts, at once.
  std::optional<Reporting> r = StartReporting(
      {"--tensorboard_dir=" + tb_dir, "--max_tensorboard_bytes=16KiB"});
  ASSERT_TRUE(r.has_value());
  FinishOneStep(*r, "a/b", 1);
  FinishOneStep(*r, "c/d", 1);
  FinishOneStep(*r, absl::StrJoin(std::vector<std::string>(64, "x"), "/"), 1);
  FinishOneStep(*r, "a/b", 2);  // the bound is not spent
  ExpectSkippedStepsWithoutErrors(r->metrics_port, "2");
  ASSERT_NO_FATAL_FAILURE(DrainAndExit(*r->server));
  EXPECT_EQ(Entries(tb_dir), (std::set<std::string>{"a"}));
  EXPECT_EQ(ReadRun(fs::path(tb_dir) / "a" / "b").steps,
            (std::set<int64_t>{1, 2}));
  fs::remove_all(tb_dir);
}

// A step the idle timeout finishes is published seconds after its work;
// its point carries the time of its last sample, so TensorBoard's time
// axes show when the step ran.
TEST(TensorBoardTimeTest, AStepIsStampedWithItsLastSample) {
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  std::optional<Reporting> r =
      StartReporting({"--tensorboard_dir=" + tb_dir, "--step_idle_timeout=3s"});
  ASSERT_TRUE(r.has_value());
  const double before = absl::ToUnixMicros(absl::Now()) * 1e-6;
  ASSERT_TRUE(r->client->ComputeLossUnary(TaggedRequest("timed", 1, 0)).ok());
  const double after = absl::ToUnixMicros(absl::Now()) * 1e-6;
  // Published by the idle timeout (checked every second), not by a drain.
  absl::SleepFor(absl::Seconds(5));
  EXPECT_TRUE(HasSample(ScrapeMetrics(r->metrics_port),
                        "klserve_indexer_last_step{run=\"timed\"}", "1"));
  ASSERT_NO_FATAL_FAILURE(DrainAndExit(*r->server));
  const RunEvents timed = ReadRun(fs::path(tb_dir) / "timed");
  ASSERT_EQ(timed.loss_wall_times.size(), 1u);
  EXPECT_GE(timed.loss_wall_times[0], before - 0.01);
  EXPECT_LE(timed.loss_wall_times[0], after + 0.01);
  fs::remove_all(tb_dir);
}

// The bound holds across restarts (a container restarted in its pod keeps
// its emptyDir): the event files found at start count against it.
TEST(TensorBoardBoundTest, EventFilesFoundAtStartCountAgainstTheBound) {
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  fs::create_directories(fs::path(tb_dir) / "earlier");
  const fs::path earlier =
      fs::path(tb_dir) / "earlier" / "events.out.tfevents.1.host.1.0000000000";
  std::ofstream(earlier) << std::string(5000, 'x');  // two 4 KiB blocks
  std::optional<Reporting> r = StartReporting(
      {"--tensorboard_dir=" + tb_dir, "--max_tensorboard_bytes=8192"});
  ASSERT_TRUE(r.has_value());
  FinishOneStep(*r, "a", 1);
  ExpectSkippedStepsWithoutErrors(r->metrics_port, "1");
  ASSERT_NO_FATAL_FAILURE(DrainAndExit(*r->server));
  EXPECT_EQ(Entries(tb_dir), (std::set<std::string>{"earlier"}));
  EXPECT_EQ(fs::file_size(earlier), 5000u);  // left as it was
  fs::remove_all(tb_dir);
}

TEST(TensorBoardBoundTest, ANonPositiveByteBoundDoesNotStart) {
  const CommandResult result =
      RunCommand({KLSERVE_BIN, "--listen=127.0.0.1:0",
                  "--metrics_listen=", "--max_tensorboard_bytes=0"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(result.err, "--max_tensorboard_bytes"))
      << result.err;
}

TEST(TensorBoardBoundTest, ANonPositiveQueueBoundDoesNotStart) {
  const CommandResult result =
      RunCommand({KLSERVE_BIN, "--listen=127.0.0.1:0",
                  "--metrics_listen=", "--max_tensorboard_queued_steps=0"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(result.err, "--max_tensorboard_queued_steps"))
      << result.err;
}

// ---------------------------------------------------------------------------
// Run names

TEST(RunNameTest, NamesOutsideTheAlphabetAreRefused) {
  std::optional<Reporting> r = StartReporting({});
  ASSERT_TRUE(r.has_value());
  for (const std::string& run :
       {std::string("job\x01"), std::string("job\x02"), std::string("a b"),
        std::string("caf\xc3\xa9"), std::string("../x"), std::string("/abs"),
        std::string("a//b"), std::string("a/"), std::string("a\\b"),
        std::string(129, 'r')}) {
    SCOPED_TRACE(absl::CEscape(run));
    const v1::ComputeLossRequest request = TaggedRequest(run, 1, 0);
    for (const bool stream : {false, true}) {
      absl::StatusOr<v1::ComputeLossResponse> refused =
          stream ? r->client->ComputeLossStreaming(request, 2)
                 : r->client->ComputeLossUnary(request);
      ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
          << Describe(refused.status());
      EXPECT_TRUE(absl::StartsWith(refused.status().message(), "tags.run: "))
          << refused.status().message();
      EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                    "ASCII letters, digits"))
          << refused.status().message();
    }
    absl::StatusOr<v1::FinishStepResponse> finish =
        r->client->FinishStep(run, 1);
    ASSERT_EQ(finish.status().code(), absl::StatusCode::kInvalidArgument)
        << Describe(finish.status());
    EXPECT_TRUE(absl::StartsWith(finish.status().message(), "run: "))
        << finish.status().message();
  }
  const std::string exposition = ScrapeMetrics(r->metrics_port);
  EXPECT_TRUE(HasSample(exposition, "klserve_rows_computed_total", "0"))
      << exposition;
  EXPECT_FALSE(absl::StrContains(exposition, "klserve_indexer_last_step{"))
      << exposition;
}

TEST(RunNameTest, NamesSanitisingMergedKeepASeriesAndADirectoryEach) {
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  std::optional<Reporting> r = StartReporting({"--tensorboard_dir=" + tb_dir});
  ASSERT_TRUE(r.has_value());
  const std::vector<std::string> runs = {"dir/x", "dir_x",
                                         "exp-1.lr3e-4/seed_2", "lr=3e-4,bs+1"};
  for (size_t i = 0; i < runs.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    ASSERT_TRUE(
        r->client->ComputeLossUnary(TaggedRequest(runs[i], step, 0)).ok())
        << runs[i];
    ASSERT_TRUE(r->client->FinishStep(runs[i], step).ok()) << runs[i];
  }
  const std::string exposition = ScrapeMetrics(r->metrics_port);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_TRUE(HasSample(
        exposition,
        absl::StrCat("klserve_indexer_last_step{run=\"", runs[i], "\"}"),
        absl::StrCat(i + 1)))
        << exposition;
  }
  ASSERT_NO_FATAL_FAILURE(DrainAndExit(*r->server));
  // A '/' makes a subdirectory: TensorBoard shows the run by its name.
  EXPECT_EQ(
      Entries(tb_dir),
      (std::set<std::string>{"dir", "dir_x", "exp-1.lr3e-4", "lr=3e-4,bs+1"}));
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(runs[i]);
    const RunEvents events = ReadRun(fs::path(tb_dir) / runs[i]);
    EXPECT_EQ(events.files, 1);
    EXPECT_EQ(events.steps, (std::set<int64_t>{static_cast<int64_t>(i) + 1}));
  }
  fs::remove_all(tb_dir);
}

// ---------------------------------------------------------------------------
// /metrics

// Clients that connect to /metrics and send part of a request line, holding
// the connection open.
std::vector<int> OpenHalfSentRequests(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    // Long enough to see the server close it, short enough to bound the
    // test if it never does.
    const int fd = ConnectLoopback(port, absl::Seconds(12));
    EXPECT_GE(fd, 0);
    if (fd < 0) break;
    EXPECT_TRUE(SendAll(fd, "GET /metr"));
    fds.push_back(fd);
  }
  // Let the server take them up before the scrape.
  absl::SleepFor(absl::Milliseconds(200));
  return fds;
}

TEST(ScrapeStallTest, TwoHalfSentRequestsDoNotStallAScrape) {
  std::optional<Reporting> r = StartReporting({});
  ASSERT_TRUE(r.has_value());
  const std::vector<int> stalled = OpenHalfSentRequests(r->metrics_port, 2);
  const absl::Time start = absl::Now();
  const std::string response = ScrapeMetrics(r->metrics_port);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response;
  EXPECT_LT(took, absl::Seconds(2))
      << "the scrape waited for the stalled clients";
  for (int fd : stalled) close(fd);
}

TEST(ScrapeStallTest, ManyHalfSentRequestsDelayAScrapeOnlyBriefly) {
  std::optional<Reporting> r = StartReporting({});
  ASSERT_TRUE(r.has_value());
  // More than there are threads: the scrape waits for one to time out.
  const std::vector<int> stalled = OpenHalfSentRequests(r->metrics_port, 12);
  const absl::Time start = absl::Now();
  const std::string response = ScrapeMetrics(r->metrics_port);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response;
  EXPECT_LT(took, absl::Seconds(5));
  // The server has closed the stalled connections by now.
  for (int fd : stalled) {
    char byte;
    const ssize_t n = recv(fd, &byte, 1, 0);
    EXPECT_GE(n, 0) << "still open: " << strerror(errno);
    close(fd);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace klserve::integration
