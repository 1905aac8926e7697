// Faults:
// - a client process SIGKILLed while its stream is in flight: the server
//   stays healthy, the stream's slot comes back (with --max_open_streams=1
//   a new stream is admitted within seconds)
//   and results stay correct;
// - SIGTERM under a tagged load with --tensorboard_dir: requests in flight
//   complete with the library's numbers or are refused with UNAVAILABLE,
//   the process exits 0, and every event file is whole (each record's
//   length and masked CRC-32C check out, no torn tail) with consecutive
//   published steps.
// - the TCP listener stuck after the process ran out of file descriptors
//   once (gRPC 1.51 never accepts again): the server notices, drains and
//   exits 1 for its supervisor to restart it.
// (A deadline that expires mid-stream is covered by lifecycle_test.cc's
// SlotTest.ExpiredStreamDeadlinesGiveTheirSlotsBack.)

#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/stream_codec.h"
#include "tests/integration/harness.h"
#include "tests/tensorboard/event_file_reader.h"

namespace klserve::integration {
namespace {

// A child process that, once it reads the server's target from `in`, opens
// a stream, sends the header and the first 8 rows of `request`, waits for
// the first gradient block, writes one byte to `out`, and then holds the
// stream open until it is killed. Forked before this process uses gRPC, so
// the child starts gRPC afresh.
struct Child {
  pid_t pid = -1;
  int to_child = -1;
  int from_child = -1;
};

Child ForkStreamingChild(const v1::ComputeLossRequest& request) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    char buf[256];
    const ssize_t n = read(down[0], buf, sizeof(buf));
    if (n <= 0) _exit(1);
    const std::string target(buf, static_cast<size_t>(n));
    absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
    if (!slicer.ok()) _exit(2);
    std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub(target);
    RawStream raw = OpenStream(*stub, absl::Seconds(60));
    v1::ComputeLossStreamRequest header;
    *header.mutable_header() = slicer->MakeHeader();
    v1::ComputeLossStreamRequest block;
    slicer->FillBlock(0, 8, block.mutable_block());
    if (!raw.stream->Write(header) || !raw.stream->Write(block)) _exit(3);
    v1::ComputeLossStreamResponse response;
    if (!raw.stream->Read(&response) || !response.has_grad_block()) _exit(4);
    // Keep sending the rest slowly: the stream stays in flight.
    const char one = 1;
    if (write(up[1], &one, 1) != 1) _exit(5);
    for (int64_t begin = 8; begin < slicer->num_rows(); begin += 1) {
      v1::ComputeLossStreamRequest next;
      slicer->FillBlock(begin, 1, next.mutable_block());
      raw.stream->Write(next);
      absl::SleepFor(absl::Milliseconds(200));
    }
    pause();
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  return {pid, down[1], up[0]};
}

TEST(ClientKilledTest, KilledMidStreamFreesItsSlotAndResultsStayCorrect) {
  constexpr int kKills = 3;
  const v1::ComputeLossRequest wide = MakeRequest(WideSpec(64, 7));
  // Fork first, before anything here starts gRPC.
  std::vector<Child> children;
  for (int i = 0; i < kKills; ++i) {
    children.push_back(ForkStreamingChild(wide));
    ASSERT_GT(children.back().pid, 0);
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_open_streams=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  ProblemSpec s;
  s.name = "after-kill";
  s.B = 2, s.T = 5, s.S = 11, s.H = 3;
  s.options.set_want_row_kl(true);
  const v1::ComputeLossRequest small = MakeRequest(s);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(small);
  ASSERT_TRUE(expected.ok()) << expected.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());

  for (Child& child : children) {
    const std::string& target = (*server)->target();
    ASSERT_EQ(write(child.to_child, target.data(), target.size()),
              static_cast<ssize_t>(target.size()));
    char byte = 0;
    ASSERT_EQ(read(child.from_child, &byte, 1), 1)
        << "the child's stream never got going";
    // The one slot is held: a new request is refused meanwhile.
    absl::StatusOr<v1::ComputeLossResponse> refused =
        client->ComputeLossStreaming(small);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
        << Describe(refused.status());

    ASSERT_EQ(kill(child.pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    close(child.to_child);
    close(child.from_child);

    // The slot comes back within a few seconds and results stay right.
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    absl::StatusOr<v1::ComputeLossResponse> after;
    do {
      after = client->ComputeLossStreaming(small);
      if (after.status().code() != absl::StatusCode::kResourceExhausted) break;
      absl::SleepFor(absl::Milliseconds(20));
    } while (absl::Now() < give_up);
    ASSERT_TRUE(after.ok())
        << "slot not freed after the client died: " << Describe(after.status());
    EXPECT_TRUE(SameResponse(*expected, *after));
    absl::StatusOr<bool> serving = client->Health();
    ASSERT_TRUE(serving.ok() && *serving) << Describe(serving.status());
    ASSERT_TRUE((*server)->Running()) << (*server)->Log();
  }
}

// ---------------------------------------------------------------------------

std::string MakeTempDir() {
  std::string templ = "/tmp/klserve_fault_tb_XXXXXX";
  char* dir = mkdtemp(templ.data());
  return dir == nullptr ? "" : std::string(dir);
}

// A peer that opened connections up to the open-file limit, once, had
// stopped the TCP listener for good (a helper's finding): gRPC 1.51 never
// accepts again after an accept fails with EMFILE, while the server looked
// healthy to the connections it had. The server here gets a limit 20 above
// the descriptors it holds, and 60 connections pass it: held open (the
// server has no descriptor left to look or probe with), or closed again
// (descriptors free, and still none taken).
TEST(ListenerStuckTest, OutOfDescriptorsOnceTheServerExitsOneToBeRestarted) {
  for (bool hold : {true, false}) {
    SCOPED_TRACE(hold ? "connections held" : "connections closed");
    absl::StatusOr<std::unique_ptr<ServerProcess>> started =
        ServerProcess::Start({"--metrics_listen="});
    ASSERT_TRUE(started.ok()) << started.status();
    ServerProcess& server = **started;
    int open = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator(
             absl::StrCat("/proc/", server.pid(), "/fd"))) {
      ++open;
    }
    const rlimit limit = {static_cast<rlim_t>(open + 20),
                          static_cast<rlim_t>(open + 20)};
    ASSERT_EQ(prlimit(server.pid(), RLIMIT_NOFILE, &limit, nullptr), 0);
    std::vector<int> connections;
    for (int i = 0; i < 60; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_GE(fd, 0);
      sockaddr_in address = {};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(server.port()));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address),
                        sizeof(address)),
                0);
      connections.push_back(fd);
    }
    absl::SleepFor(absl::Seconds(1));
    if (!hold) {
      for (int fd : connections) close(fd);
    }
    // Ten looks a second apart, a probe of up to 5 s, then the drain.
    const std::optional<int> status = server.WaitForExit(absl::Seconds(40));
    if (hold) {
      for (int fd : connections) close(fd);
    }
    ASSERT_TRUE(status.has_value()) << "still running; its log:\n"
                                    << server.Log();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1)
        << "wait status " << *status << "; its log:\n"
        << server.Log();
    EXPECT_TRUE(absl::StrContains(server.Log(), "has taken no connection"))
        << server.Log();
  }
}

TEST(SigtermUnderLoadTest, DrainsExitsZeroAndLeavesWholeEventFiles) {
  constexpr int kClients = 4;
  constexpr int kLayers = 2;
  const std::string tb_dir = MakeTempDir();
  ASSERT_FALSE(tb_dir.empty());
  absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(
      {"--tensorboard_dir=" + tb_dir, "--drain_timeout=20s",
       "--step_idle_timeout=10m", "--max_concurrent_requests=8"});
  ASSERT_TRUE(started.ok()) << started.status();
  ServerProcess& server = **started;

  ProblemSpec s;
  s.name = "tagged";
  s.B = 2, s.T = 8, s.S = 64, s.H = 2;
  s.options.set_causal(true);
  s.options.set_want_row_kl(true);
  const v1::ComputeLossRequest base = MakeRequest(s);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(base);
  ASSERT_TRUE(expected.ok()) << expected.status();

  std::atomic<bool> stop{false};
  std::atomic<bool> sigterm_sent{false};
  std::mutex mu;
  std::vector<int64_t> last_ok(kClients, 0);    // last step with an OK answer
  std::vector<int64_t> last_sent(kClients, 0);  // last step attempted
  std::vector<int> oks(kClients, 0), refusals(kClients, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<Client> client = MakeClient(server.target());
      for (int64_t step = 1; !stop.load(); ++step) {
        for (int layer = 0; layer < kLayers; ++layer) {
          v1::ComputeLossRequest request = base;
          request.set_request_id(absl::StrCat("c", c, "-s", step, "-l", layer));
          request.mutable_tags()->set_run(absl::StrCat("run", c));
          request.mutable_tags()->set_step(step);
          request.mutable_tags()->set_layer(layer);
          {
            std::lock_guard<std::mutex> lock(mu);
            last_sent[c] = step;
          }
          const bool before_sigterm = !sigterm_sent.load();
          absl::StatusOr<v1::ComputeLossResponse> r =
              (step + layer) % 2 == 0
                  ? client->ComputeLossUnary(request)
                  : client->ComputeLossStreaming(request, 3);
          std::lock_guard<std::mutex> lock(mu);
          if (r.ok()) {
            ++oks[c];
            last_ok[c] = step;
            v1::ComputeLossResponse want = *expected;
            want.set_request_id(request.request_id());
            EXPECT_TRUE(SameResponse(want, *r)) << request.request_id();
          } else {
            EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable)
                << request.request_id() << ": " << Describe(r.status())
                << (before_sigterm ? " (started before SIGTERM)" : "");
            ++refusals[c];
            return;
          }
        }
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(1500));
  sigterm_sent = true;
  server.Signal(SIGTERM);
  const std::optional<int> status = server.WaitForExit(absl::Seconds(25));
  stop = true;
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(status.has_value()) << "still running 25 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server.Log();

  for (int c = 0; c < kClients; ++c) {
    SCOPED_TRACE(absl::StrCat("run", c));
    EXPECT_GE(oks[c], 2) << "too little load before SIGTERM";
    const std::string run_dir = absl::StrCat(tb_dir, "/run", c);
    std::set<int64_t> steps;
    int files = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
      const std::string path = entry.path().string();
      if (!absl::StrContains(entry.path().filename().string(), "tfevents")) {
        continue;
      }
      ++files;
      absl::StatusOr<std::vector<event_reader::ReadEvent>> events =
          event_reader::ReadEventFile(path);
      ASSERT_TRUE(events.ok()) << path << ": " << events.status();
      for (const event_reader::ReadEvent& e : *events) {
        if (!e.summary.has_value() || !e.step.has_value()) continue;
        for (const event_reader::ReadValue& v : *e.summary) {
          if (v.tag == "indexer_loss") {
            EXPECT_TRUE(steps.insert(*e.step).second)
                << "step " << *e.step << " published twice";
          }
        }
      }
    }
    ASSERT_FALSE(ec) << run_dir << ": " << ec.message();
    EXPECT_GE(files, 1);
    ASSERT_FALSE(steps.empty());
    // Consecutive from 1, through at least the last answered step and at
    // most the last attempted one.
    EXPECT_EQ(*steps.begin(), 1);
    EXPECT_EQ(*steps.rbegin() - *steps.begin() + 1,
              static_cast<int64_t>(steps.size()))
        << "steps not consecutive";
    EXPECT_GE(*steps.rbegin(), last_ok[c]);
    EXPECT_LE(*steps.rbegin(), last_sent[c]);
    std::cout << "run" << c << ": " << oks[c] << " OK, " << refusals[c]
              << " refused, steps 1.." << *steps.rbegin() << " published in "
              << files << " file(s)\n";
  }
  std::filesystem::remove_all(tb_dir);
}

}  // namespace
}  // namespace klserve::integration
