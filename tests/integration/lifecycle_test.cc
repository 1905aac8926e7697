// Requests that end early free what they hold, and SIGTERM drains:
// - cancelled streams, expired deadlines (streams and unary calls) give
//   their slot back (with --max_concurrent_requests=2 and
//   --max_open_streams=2, two new requests are then admitted at once and
//   computed correctly) and their
//   memory (the server's RSS stops growing over repeated cancel cycles);
// - on SIGTERM health turns NOT_SERVING, new requests are refused, the
//   request in flight completes with the right numbers, and the process
//   exits 0 within the drain timeout; past the drain timeout what is left
//   is cancelled and the process still exits 0.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/stream_codec.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/harness.h"

namespace klserve::integration {
namespace {

// WideSpec with diagnostics and top-32 recall, so that computing costs more.
v1::ComputeLossRequest WideProblem(int64_t T, uint64_t seed) {
  ProblemSpec s = WideSpec(T, seed);
  s.options.set_want_diagnostics(true);
  s.options.set_recall_k(32);
  return MakeRequest(s);
}

v1::ComputeLossRequest GoodSmall() {
  ProblemSpec s;
  s.name = "small";
  s.B = 1, s.T = 3, s.S = 5, s.H = 1;
  return MakeRequest(s);
}

// A stream that has been admitted: its header and first block are in, and
// the first gradient block came back.
struct HeldStream {
  RawStream raw;
  std::vector<v1::GradBlock> blocks;
  int64_t rows_sent = 0;
};

// Opens a stream and sends the header and the first `rows` rows; returns
// the stream once their gradient is back, or the status the call ended
// with (e.g. RESOURCE_EXHAUSTED when no slot is free).
absl::StatusOr<std::unique_ptr<HeldStream>> StartHeld(
    v1::IndexerKl::Stub& stub, const RequestSlicer& slicer, int64_t rows) {
  auto held = std::make_unique<HeldStream>();
  held->raw = OpenStream(stub);
  auto& stream = *held->raw.stream;
  v1::ComputeLossStreamResponse response;
  // A failed write means the call is over; the read then fails as well and
  // Finish says why.
  if (stream.Write(HeaderMessage(slicer)))
    stream.Write(BlockMessage(slicer, 0, rows));
  if (stream.Read(&response)) {
    if (response.has_grad_block()) {
      held->blocks.push_back(response.grad_block());
      held->rows_sent = rows;
      return held;
    }
    held->raw.context->TryCancel();
  }
  const grpc::Status status = stream.Finish();
  if (status.ok()) return absl::InternalError("stream ended OK without data");
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// Sends the rest of a held stream in blocks of `rows`, reads everything,
// and assembles the response.
absl::StatusOr<v1::ComputeLossResponse> CompleteHeld(
    HeldStream& held, const RequestSlicer& slicer,
    const v1::ComputeLossRequest& request, int64_t rows) {
  auto& stream = *held.raw.stream;
  std::thread writer([&] {
    for (int64_t begin = held.rows_sent; begin < slicer.num_rows();
         begin += rows) {
      if (!stream.Write(BlockMessage(
              slicer, begin, std::min(rows, slicer.num_rows() - begin)))) {
        return;
      }
    }
    stream.WritesDone();
  });
  v1::ComputeLossStreamResponse response;
  std::optional<v1::ComputeLossResponse> result;
  while (stream.Read(&response)) {
    if (response.has_grad_block()) {
      held.blocks.push_back(response.grad_block());
    } else if (response.has_result()) {
      result = response.result();
    }
  }
  writer.join();
  const grpc::Status status = stream.Finish();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  if (!result) return absl::InternalError("no result");
  ResponseAssembler assembler(request.indexer_scores().shape());
  for (v1::GradBlock& block : held.blocks) {
    if (absl::Status s = assembler.Add(block); !s.ok()) return s;
  }
  return assembler.Finish(*std::move(result));
}

class SlotTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartServer({"--max_concurrent_requests=2", "--max_open_streams=2"}));
    stub_ = MakeStub(server().target());
    request_ = WideProblem(64, 1);
    absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request_);
    ASSERT_TRUE(expected.ok()) << expected.status();
    expected_ = *std::move(expected);
    absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request_);
    ASSERT_TRUE(slicer.ok()) << slicer.status();
    slicer_.emplace(*slicer);
  }

  // Both slots are free: two streams are admitted and in flight at once, a
  // third is refused meanwhile, and the two complete with the library's
  // numbers. A slot may take a moment to come back after a cancellation
  // (the server learns of it asynchronously), so refusals of the first two
  // are retried for a while; a leaked slot never comes back.
  void ExpectTwoSlotsFree() {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    std::unique_ptr<HeldStream> a, b;
    absl::Status last;
    while (absl::Now() < give_up) {
      a.reset();
      b.reset();
      absl::StatusOr<std::unique_ptr<HeldStream>> first =
          StartHeld(*stub_, *slicer_, 8);
      if (!first.ok()) {
        last = first.status();
        ASSERT_EQ(last.code(), absl::StatusCode::kResourceExhausted)
            << Describe(last);
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      a = *std::move(first);
      absl::StatusOr<std::unique_ptr<HeldStream>> second =
          StartHeld(*stub_, *slicer_, 5);
      if (!second.ok()) {
        last = second.status();
        ASSERT_EQ(last.code(), absl::StatusCode::kResourceExhausted)
            << Describe(last);
        a->raw.context->TryCancel();
        a->raw.stream->Finish();
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      b = *std::move(second);
      break;
    }
    ASSERT_TRUE(a != nullptr && b != nullptr)
        << "two requests were never admitted at once (a leaked slot?); last "
        << Describe(last);

    // The limit is real: a third request is refused while both are held.
    absl::StatusOr<std::unique_ptr<HeldStream>> third =
        StartHeld(*stub_, *slicer_, 4);
    EXPECT_FALSE(third.ok());
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted)
        << Describe(third.status());

    absl::StatusOr<v1::ComputeLossResponse> ra =
        CompleteHeld(*a, *slicer_, request_, 7);
    absl::StatusOr<v1::ComputeLossResponse> rb =
        CompleteHeld(*b, *slicer_, request_, 16);
    ASSERT_TRUE(ra.ok()) << Describe(ra.status());
    ASSERT_TRUE(rb.ok()) << Describe(rb.status());
    EXPECT_TRUE(SameResponse(expected_, *ra));
    EXPECT_TRUE(SameResponse(expected_, *rb));
  }

  // Opens a stream and waits until it is admitted and computing (its first
  // gradient block is back); a refusal for lack of a slot is retried for a
  // while, since a slot comes back only once the server has fully let go of
  // the previous call.
  std::unique_ptr<HeldStream> Admitted(int64_t rows) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    absl::Status last;
    while (absl::Now() < give_up) {
      absl::StatusOr<std::unique_ptr<HeldStream>> held =
          StartHeld(*stub_, *slicer_, rows);
      if (held.ok()) return *std::move(held);
      last = held.status();
      if (last.code() != absl::StatusCode::kResourceExhausted) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "stream not admitted: " << Describe(last);
    return nullptr;
  }

  // Starts two streams and cancels them: after their first gradient block
  // with `extra_blocks` more blocks of 8 rows sent meanwhile (queued or
  // computing when the cancellation comes), or, when `at_once`, right after
  // opening them.
  void CancelTwoStreams(int extra_blocks, bool at_once) {
    std::vector<RawStream> opened;
    opened.reserve(2);  // the writers hold references into it
    std::vector<std::unique_ptr<HeldStream>> held;
    std::vector<std::thread> writers;
    for (int i = 0; i < 2; ++i) {
      if (at_once) {
        opened.push_back(OpenStream(*stub_));
        RawStream& raw = opened.back();
        writers.emplace_back(
            [this, &raw] { raw.stream->Write(HeaderMessage(*slicer_)); });
        continue;
      }
      held.push_back(Admitted(8));
      if (held.back() == nullptr) return;
    }
    for (auto& h : held) {
      HeldStream* stream = h.get();
      writers.emplace_back([this, stream, extra_blocks] {
        for (int i = 1; i <= extra_blocks; ++i) {
          if (!stream->raw.stream->Write(BlockMessage(*slicer_, 8 * i, 8)))
            return;
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(20));
    for (RawStream& raw : opened) raw.context->TryCancel();
    for (auto& h : held) h->raw.context->TryCancel();
    for (std::thread& writer : writers) writer.join();
    for (RawStream& raw : opened) {
      const grpc::Status status = raw.stream->Finish();
      EXPECT_TRUE(status.error_code() == grpc::StatusCode::CANCELLED ||
                  status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
          << Describe(status);
    }
    for (auto& h : held) {
      v1::ComputeLossStreamResponse response;
      while (h->raw.stream->Read(&response)) {
      }
      const grpc::Status status = h->raw.stream->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
          << Describe(status);
    }
  }

  std::unique_ptr<v1::IndexerKl::Stub> stub_;
  v1::ComputeLossRequest request_;
  v1::ComputeLossResponse expected_;
  std::optional<RequestSlicer> slicer_;
};

TEST_F(SlotTest, TwoSlotsFreeAtStart) { ExpectTwoSlotsFree(); }

TEST_F(SlotTest, CancelledStreamsGiveTheirSlotsBack) {
  CancelTwoStreams(/*extra_blocks=*/0, /*at_once=*/false);
  ExpectTwoSlotsFree();
  CancelTwoStreams(/*extra_blocks=*/0, /*at_once=*/true);
  ExpectTwoSlotsFree();
  // Cancelled with blocks queued and computing.
  CancelTwoStreams(/*extra_blocks=*/7, /*at_once=*/false);
  ExpectTwoSlotsFree();
}

TEST_F(SlotTest, ExpiredStreamDeadlinesGiveTheirSlotsBack) {
  // Each stream gets its first gradient, then waits past its deadline in
  // the middle of the problem.
  std::vector<RawStream> streams(2);
  for (RawStream& raw : streams) {
    raw = OpenStream(*stub_, absl::Seconds(1));
    ASSERT_TRUE(raw.stream->Write(HeaderMessage(*slicer_)));
    ASSERT_TRUE(raw.stream->Write(BlockMessage(*slicer_, 0, 8)));
    v1::ComputeLossStreamResponse response;
    ASSERT_TRUE(raw.stream->Read(&response));
    ASSERT_TRUE(response.has_grad_block());
  }
  for (RawStream& raw : streams) {
    v1::ComputeLossStreamResponse response;
    EXPECT_FALSE(raw.stream->Read(&response));  // ends at the deadline
    const grpc::Status status = raw.stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << Describe(status);
  }
  ExpectTwoSlotsFree();
}

TEST_F(SlotTest, ExpiredUnaryDeadlinesGiveTheirSlotsBack) {
  // A 16 MiB problem under deadlines that expire while it is sent, queued
  // or computed; the server computes what it admitted and lets it go.
  const v1::ComputeLossRequest big = WideProblem(512, 2);
  for (int ms : {5, 20, 50, 100}) {
    std::unique_ptr<Client> hasty =
        MakeClient(server().target(), 1, absl::Milliseconds(ms));
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&] {
        absl::StatusOr<v1::ComputeLossResponse> r =
            hasty->ComputeLossUnary(big);
        EXPECT_TRUE(r.ok() ||
                    r.status().code() == absl::StatusCode::kDeadlineExceeded ||
                    r.status().code() == absl::StatusCode::kResourceExhausted)
            << Describe(r.status());
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ExpectTwoSlotsFree();
}

// Repeated cycles of a cancelled stream and a stream whose deadline expires,
// each holding megabytes: the server's memory settles instead of growing
// with every cycle. (Measured here: about 48 MiB after warm-up, then steps
// of a few MiB now and then, the same with streams that end normally; a
// leak of one 2 MiB block per cycle would add 80 MiB over the cycles.)
TEST_F(SlotTest, RssDoesNotGrowOverCancelCycles) {
  const v1::ComputeLossRequest big = WideProblem(256, 3);  // 8 MiB of input
  absl::StatusOr<RequestSlicer> big_slicer = RequestSlicer::Create(big);
  ASSERT_TRUE(big_slicer.ok());
  const auto cycle = [&] {
    std::vector<RawStream> streams;
    streams.push_back(OpenStream(*stub_));
    streams.push_back(OpenStream(*stub_, absl::Milliseconds(60)));
    std::vector<std::thread> writers;
    for (RawStream& raw : streams) {
      writers.emplace_back([&raw, &big_slicer] {
        if (!raw.stream->Write(HeaderMessage(*big_slicer))) return;
        for (int i = 0; i < 4; ++i) {  // 4 blocks of 2 MiB
          if (!raw.stream->Write(BlockMessage(*big_slicer, 64 * i, 64))) return;
        }
      });
    }
    v1::ComputeLossStreamResponse response;
    streams[0].stream->Read(&response);
    streams[0].context->TryCancel();
    while (streams[1].stream->Read(&response)) {  // until the deadline
    }
    for (std::thread& writer : writers) writer.join();
    for (RawStream& raw : streams) raw.stream->Finish();
  };
  constexpr int kWarmup = 10, kCycles = 40;
  for (int i = 0; i < kWarmup; ++i) cycle();
  absl::SleepFor(absl::Milliseconds(100));
  absl::StatusOr<int64_t> before = server().RssKiB();
  ASSERT_TRUE(before.ok()) << before.status();
  for (int i = 0; i < kCycles; ++i) cycle();
  absl::SleepFor(absl::Milliseconds(100));
  absl::StatusOr<int64_t> after = server().RssKiB();
  ASSERT_TRUE(after.ok()) << after.status();
  RecordProperty("rss_before_kib", std::to_string(*before));
  RecordProperty("rss_after_kib", std::to_string(*after));
  EXPECT_LT(*after - *before, 48 * 1024)
      << "VmRSS " << *before << " KiB after warm-up, " << *after
      << " KiB after " << kCycles << " more cycles";
  ExpectTwoSlotsFree();
}

// Two clients, each sending its requests one after another, never have more
// than two in flight, so with two slots of each kind none may be
// refused: once a client has its answer, its slot must be free.
// (A stream once gave its slot back only when its reactor was deleted,
// after the client had its final status, and about 15 of 600 back-to-back
// streams were refused; streams now give it back as they finish.)
class BackToBackTest : public SlotTest,
                       public ::testing::WithParamInterface<bool> {};

TEST_P(BackToBackTest, SequentialRequestsOfTwoClientsAreNeverRefused) {
  const bool stream = GetParam();
  const v1::ComputeLossRequest request = GoodSmall();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  constexpr int kPerClient = 300;
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int j = 0; j < 2; ++j) {
    threads.emplace_back([&] {
      std::unique_ptr<Client> client = MakeClient(server().target());
      if (client == nullptr) return;
      for (int i = 0; i < kPerClient; ++i) {
        absl::StatusOr<v1::ComputeLossResponse> response =
            stream ? client->ComputeLossStreaming(request, 1)
                   : client->ComputeLossUnary(request);
        if (response.ok()) {
          EXPECT_TRUE(SameResponse(*expected, *response));
        } else if (response.status().code() ==
                   absl::StatusCode::kResourceExhausted) {
          ++refused;
        } else {
          ADD_FAILURE() << Describe(response.status());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(refused.load(), 0)
      << refused.load() << " of " << 2 * kPerClient
      << " back-to-back requests were refused for lack of a slot";
}

INSTANTIATE_TEST_SUITE_P(Transports, BackToBackTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Stream" : "Unary";
                         });

// ---------------------------------------------------------------------------
// Draining.

TEST_F(ServerTest, SigtermDrainsTheRequestInFlightThenExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--drain_timeout=20s"}));
  ExpectServerToExit();
  // Per-head BF16 logits and FP32 scores, 32 KiB per row, 4 MiB in all,
  // sent in 16 blocks of 8 rows: half before the signal, half after.
  ProblemSpec s;
  s.name = "drain";
  s.B = 2, s.T = 64, s.S = 4096, s.H = 2;
  s.target_dtype = "BF16";
  s.options.set_causal(true);
  s.options.set_want_row_kl(true);
  s.options.set_want_diagnostics(true);
  s.options.set_recall_k(16);
  s.seed = 9;
  const v1::ComputeLossRequest request = MakeRequest(s);
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub(server().target());

  absl::StatusOr<std::unique_ptr<HeldStream>> held =
      StartHeld(*stub, *slicer, 8);
  ASSERT_TRUE(held.ok()) << Describe(held.status());
  auto& stream = *(*held)->raw.stream;
  for (int64_t begin = 8; begin < 64; begin += 8) {
    ASSERT_TRUE(stream.Write(BlockMessage(*slicer, begin, 8)));
    v1::ComputeLossStreamResponse response;
    ASSERT_TRUE(stream.Read(&response));
    ASSERT_TRUE(response.has_grad_block());
    (*held)->blocks.push_back(response.grad_block());
  }
  (*held)->rows_sent = 64;

  // The server as a whole ("") and the service by its name both serve.
  std::unique_ptr<Client> probe =
      MakeClient(server().target(), 1, absl::Seconds(2));
  const std::string service(v1::IndexerKl::service_full_name());
  for (const std::string& name : {std::string(), service}) {
    absl::StatusOr<bool> serving = probe->Health(name);
    ASSERT_TRUE(serving.ok())
        << "\"" << name << "\" " << Describe(serving.status());
    EXPECT_TRUE(*serving) << name;
  }
  server().Signal(SIGTERM);
  // Health turns NOT_SERVING while the request is still in flight.
  bool not_serving = false;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
       absl::Now() < give_up;) {
    absl::StatusOr<bool> serving = probe->Health();
    ASSERT_TRUE(serving.ok())
        << "health during the drain: " << Describe(serving.status());
    if (!*serving) {
      not_serving = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(not_serving) << "health never turned NOT_SERVING";
  absl::StatusOr<bool> service_serving = probe->Health(service);
  ASSERT_TRUE(service_serving.ok()) << Describe(service_serving.status());
  EXPECT_FALSE(*service_serving);
  // New requests are refused, unary and streamed.
  absl::StatusOr<v1::ComputeLossResponse> refused =
      probe->ComputeLossUnary(GoodSmall());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << Describe(refused.status());
  absl::StatusOr<v1::ComputeLossResponse> refused_stream =
      probe->ComputeLossStreaming(GoodSmall(), 1);
  EXPECT_EQ(refused_stream.status().code(), absl::StatusCode::kUnavailable)
      << Describe(refused_stream.status());
  EXPECT_TRUE(server().Running()) << "exited with a request in flight";

  // The request in flight completes, with the library's numbers.
  absl::StatusOr<v1::ComputeLossResponse> response =
      CompleteHeld(**held, *slicer, request, 8);
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  EXPECT_TRUE(SameResponse(*expected, *response));

  const std::optional<int> status = server().WaitForExit(absl::Seconds(15));
  ASSERT_TRUE(status.has_value()) << "still running after the drain";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server().Log();
}

// A large answer makes gRPC wait for the socket to take it, and gRPC 1.51
// then polls that socket for 10 s at a time on its executor thread, which
// its global shutdown joins: an idle server once took up to 10 s past the
// drain to exit after such an answer. That was a race (an attacking
// helper's Python client met it in about 1 exit in 8 on a loaded machine;
// this test's client did not meet it in 11 runs), so this test catches it
// only sometimes; what it always checks is that an idle server's exit
// takes no time of its own: the /metrics server's stop took 0.7 s on top of
// the drain's half second for calls that slip in while gRPC stops (with
// this harness's connections, the whole exit now takes 0.52 s). Not in the
// sanitize stage, whose build exits the long way for LeakSanitizer
// (klserve_main.cc).
TEST_F(ServerTest, SigtermAfterALargeAnswerExitsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--drain_timeout=20s"}));
  ExpectServerToExit();
  ProblemSpec spec;
  spec.name = "large-answer";
  spec.B = 1, spec.T = 64, spec.S = 1 << 16, spec.H = 0;
  spec.seed = 4;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::ComputeLossResponse> answer =
        client().ComputeLossUnary(MakeRequest(spec));
    ASSERT_TRUE(answer.ok()) << Describe(answer.status());
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time signalled = absl::Now();
  server().Signal(SIGTERM);
  const std::optional<int> status = server().WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "still running 30 s after SIGTERM";
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(1))
      << "the exit took " << (absl::Now() - signalled);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server().Log();
}

TEST_F(ServerTest, DrainTimeoutCancelsWhatIsLeftAndExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--drain_timeout=1s"}));
  ExpectServerToExit();
  const v1::ComputeLossRequest request = WideProblem(32, 4);
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub(server().target());
  // A stream that never finishes sending.
  absl::StatusOr<std::unique_ptr<HeldStream>> held =
      StartHeld(*stub, *slicer, 4);
  ASSERT_TRUE(held.ok()) << Describe(held.status());

  const absl::Time signalled = absl::Now();
  server().Signal(SIGTERM);
  const std::optional<int> status = server().WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(status.has_value()) << "still running 10 s after SIGTERM";
  const absl::Duration took = absl::Now() - signalled;
  EXPECT_GE(took, absl::Milliseconds(900)) << "did not wait for the drain";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server().Log();

  v1::ComputeLossStreamResponse response;
  while ((*held)->raw.stream->Read(&response)) {
  }
  const grpc::Status end = (*held)->raw.stream->Finish();
  EXPECT_FALSE(end.ok()) << "the unfinished stream ended OK";
}

// A health Watch never ends on its own; the drain must not wait for it (nor
// for its own deadline) once no IndexerKl call is left.
TEST_F(ServerTest, OpenHealthWatchDoesNotHoldTheDrain) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--drain_timeout=20s"}));
  ExpectServerToExit();
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(grpc::CreateChannel(
          server().target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::health::v1::HealthCheckRequest request;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>>
      watch = health->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  const absl::Time signalled = absl::Now();
  server().Signal(SIGTERM);
  const std::optional<int> status = server().WaitForExit(absl::Seconds(15));
  ASSERT_TRUE(status.has_value()) << "still running 15 s after SIGTERM";
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(5))
      << "the drain waited for the health Watch";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server().Log();
  // The watcher heard NOT_SERVING, then the end of the stream.
  bool heard_not_serving = false;
  while (watch->Read(&update)) {
    heard_not_serving |=
        update.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  }
  EXPECT_TRUE(heard_not_serving);
  static_cast<void>(watch->Finish());  // any status: the server is gone
}

// gRPC binds with SO_REUSEPORT by default, so a second server on the same
// --listen would start and take a share of the calls; klserve refuses to
// start instead, and the first keeps serving.
TEST_F(ServerTest, SecondServerOnTheSamePortRefusesToStart) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  absl::StatusOr<std::unique_ptr<ServerProcess>> second =
      ServerProcess::Start({"--listen=" + server().target()});
  ASSERT_FALSE(second.ok())
      << "a second klserve serves on " << server().target();
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                "--listen: cannot serve on " +
                                    server().target() +
                                    " (Address already in use)"))
      << second.status();
  // The metrics port says why too, where civetweb said "null context".
  absl::StatusOr<std::unique_ptr<ServerProcess>> third = ServerProcess::Start(
      {absl::StrCat("--metrics_listen=127.0.0.1:", server().metrics_port())});
  ASSERT_FALSE(third.ok());
  EXPECT_TRUE(absl::StrContains(
      third.status().message(),
      absl::StrCat("--metrics_listen: cannot serve metrics on \"127.0.0.1:",
                   server().metrics_port(),
                   "\": Address already in use; give another HOST:PORT, or "
                   "--metrics_listen= to serve none")))
      << third.status();
  absl::StatusOr<bool> serving = client().Health();
  ASSERT_TRUE(serving.ok()) << Describe(serving.status());
  EXPECT_TRUE(*serving);
}

// An IPv6 metrics address either serves or, where civetweb was built
// without IPv6 (Debian's), is refused at start saying so, not with
// civetweb's "null context".
TEST(CommandLineTest, AnIpv6MetricsAddressServesOrIsRefusedSayingWhy) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::Start({"--metrics_listen=[::1]:0"});
  if (started.ok()) GTEST_SKIP() << "this civetweb serves IPv6";
  EXPECT_TRUE(absl::StrContains(
      started.status().message(),
      "--metrics_listen: this build's HTTP server (civetweb) has no IPv6 (a "
      "host in brackets), got \"[::1]:0\""))
      << started.status();
}

// The files the flags name are read before any port is bound: with the
// metrics port taken too, a missing token file or TLS certificate is what
// the refusal names, so that a misconfigured start says first what is wrong
// with its configuration.
TEST_F(ServerTest, AMissingFileIsNamedBeforeABusyPort) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string busy_metrics =
      absl::StrCat("--metrics_listen=127.0.0.1:", server().metrics_port());
  const std::string missing = ::testing::TempDir() + "klserve-no-such-file";
  for (const auto& [flags, want] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--auth_token_file=" + missing},
            "--auth_token_file: cannot read \"" + missing + "\""},
           {{"--tls_cert=" + missing, "--tls_key=" + missing},
            "--tls_cert: cannot read \"" + missing + "\""}}) {
    std::vector<std::string> args = flags;
    args.push_back(busy_metrics);
    absl::StatusOr<std::unique_ptr<ServerProcess>> refused =
        ServerProcess::Start(args);
    ASSERT_FALSE(refused.ok()) << want << ": started";
    EXPECT_TRUE(absl::StrContains(refused.status().message(), want))
        << refused.status();
  }
}

TEST_F(ServerTest, SigintOnAnIdleServerExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ExpectServerToExit();
  server().Signal(SIGINT);
  const std::optional<int> status = server().WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(status.has_value()) << "still running 10 s after SIGINT";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "wait status " << *status << "; log:\n"
      << server().Log();
}

// Thread counts past what the system makes aborted the server
// (std::system_error from std::thread) and a negative one meant "auto":
// both are start-up errors naming the flag.
TEST(CommandLineTest, ThreadCountsOutOfRangeAreStartupErrors) {
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"threads", "100000"},
           {"threads", "-1"},
           {"max_concurrent_requests", "5000"}}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start({absl::StrCat("--", flag, "=", value)});
    ASSERT_FALSE(server.ok()) << flag << "=" << value << " started";
    EXPECT_TRUE(absl::StrContains(
        server.status().message(),
        absl::StrCat("--", flag, ": must be in [", flag == "threads" ? 0 : 1,
                     ", 1024], got ", value)))
        << server.status();
  }
}

// A duration the server cannot wait for is a start-up error naming the flag
// (--drain_timeout and --step_idle_timeout took any, an infinite drain
// letting one client hold a stopping server for --max_stream_duration);
// --release_memory_after_idle takes 0 too (never) but no period short
// enough to spin, --drain_timeout 0 (at once), --step_idle_timeout inf.
TEST(CommandLineTest, DurationsOutOfRangeAreStartupErrors) {
  for (const auto& [flag, value, expected] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"release_memory_after_idle", "-1s",
            "must be a finite duration of at least 100ms, or 0 (never), got "
            "-1s"},
           {"release_memory_after_idle", "inf",
            "must be a finite duration of at least 100ms, or 0 (never), got "
            "inf"},
           {"release_memory_after_idle", "1ns",
            "must be a finite duration of at least 100ms, or 0 (never), got "
            "1ns"},
           {"stream_idle_timeout", "0",
            "must be a positive, finite duration, got 0"},
           {"step_idle_timeout", "-1s",
            "must be a positive duration (inf: only FinishStep or the run's "
            "next step publishes a step), got -1s"},
           {"step_idle_timeout", "0",
            "must be a positive duration (inf: only FinishStep or the run's "
            "next step publishes a step), got 0"},
           {"drain_timeout", "-1s",
            "must be a finite duration, 0 or more (0 cancels what is in "
            "flight at once), got -1s"},
           {"drain_timeout", "inf",
            "must be a finite duration, 0 or more (0 cancels what is in "
            "flight at once), got inf"}}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start({absl::StrCat("--", flag, "=", value)});
    ASSERT_FALSE(server.ok()) << flag << "=" << value << " started";
    EXPECT_TRUE(absl::StrContains(server.status().message(),
                                  absl::StrCat("--", flag, ": ", expected)))
        << server.status();
  }
}

// A TensorBoard directory the server cannot make is refused at start, not
// found at the first step.
TEST(CommandLineTest, AnUnusableTensorBoardDirectoryIsAStartupError) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--tensorboard_dir=/proc/klserve-nope"});
  ASSERT_FALSE(server.ok()) << "started";
  EXPECT_TRUE(absl::StrContains(server.status().message(),
                                "--tensorboard_dir: cannot create "
                                "directory /proc/klserve-nope"))
      << server.status();
}

// Asking for help is not an error, and the help names each flag's file by
// its path in the repository, not the build machine's checkout.
TEST(CommandLineTest, HelpExitsZeroAndListsEveryFlag) {
  const CommandResult help = RunCommand({KLSERVE_BIN, "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  const std::string text = help.out + help.err;
  EXPECT_TRUE(
      absl::StrContains(text, "Flags from server/service/klserve_main.cc"))
      << text;
  for (const char* flag :
       {"--listen", "--max_open_streams", "--stream_idle_timeout",
        "--enable_echo", "--max_layers_per_run", "--auth_token_file",
        "--unix_socket_mode", "--release_memory_after_idle"}) {
    EXPECT_TRUE(absl::StrContains(text, flag)) << flag;
  }
  const CommandResult unknown = RunCommand({KLSERVE_BIN, "--no_such_flag"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown.err, "no_such_flag")) << unknown.err;
}

}  // namespace
}  // namespace klserve::integration
