// Attacks on the server, as a hostile or broken client makes them, each
// against the real binary on loopback (issue 12's findings): idle and
// over-long streams, Echo amplification, unauthenticated traffic on a token
// server (raw HTTP/2: header-only calls, uploads cut short, rapid resets,
// too many streams on a connection), reflection, responses within a few
// bytes of the message limit, stream blocks carrying tensors in the wrong
// field, huge values quoted in errors, unparsable bytes, header tensors over
// the tensor limit, and a scaling factor that would overflow the gradient.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/call_status.h"
#include "client/stream_codec.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "proto/call_metadata.h"
#include "tests/integration/harness.h"
#include "tests/integration/raw_http2.h"

namespace klserve::integration {
namespace {

constexpr char kToken[] = "hardening-token";
constexpr char kComputeLoss[] = "/klserve.v1.IndexerKl/ComputeLoss";
constexpr char kComputeLossStream[] = "/klserve.v1.IndexerKl/ComputeLossStream";

::testing::AssertionResult HasCode(const grpc::Status& status,
                                   grpc::StatusCode code,
                                   absl::string_view contains = "") {
  if (status.error_code() == code &&
      absl::StrContains(status.error_message(), contains)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "want code " << code << " with \"" << contains << "\", got "
         << Describe(status);
}

::testing::AssertionResult HasCode(const absl::Status& status,
                                   absl::StatusCode code,
                                   absl::string_view contains = "") {
  if (status.code() == code && absl::StrContains(status.message(), contains)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "want " << absl::StatusCodeToString(code) << " with \"" << contains
         << "\", got " << Describe(status);
}

v1::ComputeLossRequest Small(int64_t T = 3, int64_t S = 5) {
  ProblemSpec s;
  s.name = "small";
  s.B = 1, s.T = T, s.S = S, s.H = 0;
  s.options.set_want_row_kl(true);
  return MakeRequest(s);
}

// A small unary request sent until it is admitted (for up to 5 s: slots
// that an attack held come back within that), and checked bit for bit.
void ExpectServedExactly(Client& client) {
  const v1::ComputeLossRequest request = Small();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  absl::StatusOr<v1::ComputeLossResponse> got;
  do {
    got = client.ComputeLossUnary(request);
    if (got.status().code() != absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < give_up);
  ASSERT_TRUE(got.ok()) << Describe(got.status());
  EXPECT_TRUE(SameResponse(*expected, *got));
}

std::shared_ptr<grpc::Channel> ChannelTo(const std::string& target) {
  return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
}

grpc::ByteBuffer BytesOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string StringOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// A unary call of `method` with `bytes` as its message, whatever they are,
// sent compressed with `compression`.
grpc::Status RawUnary(
    grpc::Channel& channel, const std::string& method, const std::string& bytes,
    const std::string& token = "",
    grpc_compression_algorithm compression = GRPC_COMPRESS_NONE) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  if (compression != GRPC_COMPRESS_NONE) {
    context.set_compression_algorithm(compression);
  }
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  grpc::ByteBuffer response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel,
      grpc::internal::RpcMethod(method.c_str(),
                                grpc::internal::RpcMethod::NORMAL_RPC),
      &context, BytesOf(bytes), &response);
}

// A bidi call of `method` sending `messages` as they are, then closing; the
// final status and what came back.
struct RawStreamOutcome {
  grpc::Status status;
  std::vector<std::string> responses;
};
RawStreamOutcome RawBidi(grpc::Channel& channel, const std::string& method,
                         const std::vector<std::string>& messages,
                         const std::string& token = "") {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer,
                                                       grpc::ByteBuffer>::
                 Create(&channel,
                        grpc::internal::RpcMethod(
                            method.c_str(),
                            grpc::internal::RpcMethod::BIDI_STREAMING),
                        &context));
  std::thread writer([&] {
    for (const std::string& m : messages) {
      if (!stream->Write(BytesOf(m))) break;
    }
    stream->WritesDone();
  });
  RawStreamOutcome outcome;
  grpc::ByteBuffer response;
  while (stream->Read(&response))
    outcome.responses.push_back(StringOf(response));
  writer.join();
  outcome.status = stream->Finish();
  return outcome;
}

// The value of the series `name{labels}` (labels as the exposition writes
// them), or -1 when absent.
double SeriesValue(const std::string& scrape, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double value = -1;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) {
        return value;
      }
    }
  }
  return -1;
}

int64_t RssGrowthKiB(ServerProcess& server, int64_t before) {
  absl::StatusOr<int64_t> now = server.RssKiB();
  return now.ok() ? *now - before : -1;
}

// ---------------------------------------------------------------------------
// Item 2: idle streams. They hold stream slots, never the unary requests'
// compute slots, and the idle timeout frees their slots.

class IdleStreamTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartServer({"--max_open_streams=2", "--max_concurrent_requests=1",
                     "--stream_idle_timeout=1s"}));
    stub_ = MakeStub(server().target());
  }
  std::unique_ptr<v1::IndexerKl::Stub> stub_;
};

TEST_F(IdleStreamTest, IdleStreamsNeitherLockOutOthersNorStayOpen) {
  const v1::ComputeLossRequest request = Small();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();

  // One stream sends nothing, the other its header only.
  RawStream silent = OpenStream(*stub_);
  RawStream header_only = OpenStream(*stub_);
  ASSERT_TRUE(header_only.stream->Write(HeaderMessage(*slicer)));
  const absl::Time opened = absl::Now();

  // Unary calls are not held up by them at all.
  absl::StatusOr<v1::ComputeLossResponse> unary =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(unary.ok()) << Describe(unary.status());
  EXPECT_TRUE(SameResponse(*expected, *unary));

  // A third stream waits at most the idle timeout (+ the watchdog's tick and
  // a slow machine's slack) for a slot.
  absl::StatusOr<v1::ComputeLossResponse> streamed;
  do {
    streamed = client().ComputeLossStreaming(request);
    if (streamed.status().code() != absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() - opened < absl::Seconds(4));
  ASSERT_TRUE(streamed.ok()) << Describe(streamed.status());
  EXPECT_TRUE(SameResponse(*expected, *streamed));
  EXPECT_LT(absl::Now() - opened, absl::Seconds(4));

  for (RawStream* idle : {&silent, &header_only}) {
    EXPECT_TRUE(HasCode(idle->stream->Finish(),
                        grpc::StatusCode::DEADLINE_EXCEEDED,
                        "--stream_idle_timeout"));
  }
}

// A call refused at the limit of calls in flight did not run: the server
// marks it (trailing metadata), and the client retries it with backoff as it
// does UNAVAILABLE, so that a burst of calls from many ranks does not fail a
// training step (found by an ML-engineer helper).
TEST(OverloadTest, ARefusalAtTheLimitIsMarkedAndRetriedByTheClient) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--max_open_streams=1", "--stream_idle_timeout=2s"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  const v1::ComputeLossRequest request = Small();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();

  RawStream holder = OpenStream(*stub);  // holds the one slot for 2 s
  absl::SleepFor(absl::Milliseconds(200));
  RawStream refused = OpenStream(*stub);
  const grpc::Status status = refused.stream->Finish();
  EXPECT_TRUE(HasCode(status, grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "--max_open_streams"));
  const auto& trailers = refused.context->GetServerTrailingMetadata();
  const auto mark = trailers.find(kOverloadedMetadataKey);
  ASSERT_NE(mark, trailers.end());
  EXPECT_EQ(std::string(mark->second.data(), mark->second.size()),
            "max_open_streams");
  // Without retries the client reports it...
  EXPECT_TRUE(HasCode(MakeClient((*server)->target(), /*max_attempts=*/1)
                          ->ComputeLossStreaming(request)
                          .status(),
                      absl::StatusCode::kResourceExhausted,
                      "--max_open_streams"));
  // ... and after its retries, says how many it made, keeping the mark.
  const absl::Status retried_out =
      MakeClient((*server)->target(), /*max_attempts=*/3)
          ->ComputeLossStreaming(request)
          .status();
  EXPECT_TRUE(HasCode(retried_out, absl::StatusCode::kResourceExhausted,
                      "(refused 3 times in "));
  EXPECT_TRUE(IsOverloaded(retried_out)) << retried_out;
  // Counted apart from a size limit's RESOURCE_EXHAUSTED: 1 + 1 + 3 so far.
  EXPECT_EQ(SeriesValue(ScrapeMetrics((*server)->metrics_port()),
                        "klserve_refused_at_limit_total{limit=\"max_open_"
                        "streams\"}"),
            5);
  // With enough it waits for the slot, which the idle timeout frees.
  absl::StatusOr<v1::ComputeLossResponse> retried =
      MakeClient((*server)->target(), /*max_attempts=*/10)
          ->ComputeLossStreaming(request);
  ASSERT_TRUE(retried.ok()) << Describe(retried.status());
  EXPECT_TRUE(SameResponse(*expected, *retried));
  EXPECT_TRUE(HasCode(holder.stream->Finish(),
                      grpc::StatusCode::DEADLINE_EXCEEDED,
                      "--stream_idle_timeout"));
  // A refusal that would fail again (a tensor past its limit) is not retried.
  absl::StatusOr<std::unique_ptr<ServerProcess>> small =
      ServerProcess::Start({"--max_tensor_bytes=32"});  // Small's are 60
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(HasCode(MakeClient((*small)->target(), /*max_attempts=*/10)
                          ->ComputeLossUnary(request)
                          .status(),
                      absl::StatusCode::kResourceExhausted,
                      "--max_tensor_bytes"));
  EXPECT_EQ(SeriesValue(ScrapeMetrics((*small)->metrics_port()),
                        "klserve_requests_total{code=\"RESOURCE_EXHAUSTED\","
                        "method=\"ComputeLoss\"}"),
            1);
}

TEST(StreamDurationTest, AStreamThatTricklesIsEndedAtItsMaximumDuration) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--max_stream_duration=2s", "--stream_idle_timeout=1500ms"});
  ASSERT_TRUE(server.ok()) << server.status();
  const v1::ComputeLossRequest request = Small(64, 8);
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  RawStream raw = OpenStream(*stub);
  const absl::Time start = absl::Now();
  std::thread reader([&] {
    v1::ComputeLossStreamResponse response;
    while (raw.stream->Read(&response)) {
    }
  });
  // One row every 250 ms: never idle, never done within 2 s.
  bool written = raw.stream->Write(HeaderMessage(*slicer));
  for (int64_t row = 0; written && row < 64; ++row) {
    written = raw.stream->Write(BlockMessage(*slicer, row, 1));
    absl::SleepFor(absl::Milliseconds(250));
  }
  reader.join();
  const grpc::Status status = raw.stream->Finish();
  EXPECT_TRUE(HasCode(status, grpc::StatusCode::DEADLINE_EXCEEDED,
                      "--max_stream_duration"));
  EXPECT_GT(absl::Now() - start, absl::Milliseconds(1900));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

// ---------------------------------------------------------------------------
// Item 8: Echo.

TEST(EchoTest, OffUnlessEnabled) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  EXPECT_TRUE(HasCode(client->EchoStream(1, 10, 1 << 20).status(),
                      absl::StatusCode::kUnimplemented, "--enable_echo"));
}

TEST(EchoTest, UnreadRepliesAreTimedOutWithBoundedRss) {
  constexpr int kStreams = 4;
  constexpr int64_t kLimit = int64_t{16} << 20;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--enable_echo", absl::StrCat("--max_message_bytes=", kLimit),
       absl::StrCat("--max_open_streams=", kStreams),
       "--stream_idle_timeout=1s"});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());

  // Tiny requests asking for large replies, never read.
  struct Unread {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::EchoRequest, v1::EchoResponse>>
        stream;
  };
  std::vector<Unread> unread;
  for (int i = 0; i < kStreams; ++i) {
    Unread u;
    u.context = std::make_unique<grpc::ClientContext>();
    u.context->set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    u.stream = stub->Echo(u.context.get());
    v1::EchoRequest ask;
    ask.set_reply_bytes(kLimit - 16);
    for (int j = 0; j < 12; ++j) u.stream->Write(ask);
    unread.push_back(std::move(u));
  }
  absl::SleepFor(absl::Milliseconds(500));
  // Each stream holds at most 3 replies: 4 x 3 x 16 MiB, far from what 48
  // asked for.
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 260 * 1024) << "RSS grew by " << growth << " KiB";

  // The idle timeout ends them and gives the slots back.
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  absl::Status echo;
  do {
    echo = client->EchoStream(2, 16, 16).status();
    if (echo.code() != absl::StatusCode::kResourceExhausted) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < give_up);
  EXPECT_TRUE(echo.ok()) << Describe(echo);
  for (Unread& u : unread) {
    u.context->TryCancel();
    u.stream->Finish();
  }
  EXPECT_TRUE((*server)->Running());
}

// ---------------------------------------------------------------------------
// Items 3 and 4: a token server and peers without the token.

// A call of `method`, on a new connection to `port`, that announces a
// message of `declared_bytes` and sends 60 KB of it (within HTTP/2's first
// window): the server must end it within 3 s, without waiting for the
// rest. `connection` keeps the connection open for the caller.
void ExpectUploadEndsAtItsHeaders(int port, const std::string& method,
                                  uint32_t declared_bytes,
                                  std::unique_ptr<RawHttp2>& connection) {
  absl::StatusOr<std::unique_ptr<RawHttp2>> h2 = RawHttp2::Connect(port);
  ASSERT_TRUE(h2.ok()) << h2.status();
  absl::StatusOr<uint32_t> stream = (*h2)->OpenCall(method);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*h2)
                  ->SendMessage(*stream, std::string(60000, 'x'),
                                declared_bytes, /*end_stream=*/false)
                  .ok());
  ASSERT_TRUE((*h2)->Pump(absl::Seconds(3), *stream).ok());
  EXPECT_TRUE((*h2)->end(*stream).ended)
      << method << " still open: the server waits for the message";
  connection = *std::move(h2);
}

// kToken in a file of a new temporary directory, for --auth_token_file.
void WriteTokenFile(std::string& path) {
  char dir[] = "/tmp/klserve_hardening_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  path = std::string(dir) + "/token";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs(kToken, f);
  fclose(f);
}

class TokenServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(WriteTokenFile(token_file_));
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start({"--auth_token_file=" + token_file_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    absl::StatusOr<int64_t> rss = server_->RssKiB();
    ASSERT_TRUE(rss.ok());
    rss_before_ = *rss;
  }
  void TearDown() override {
    if (server_ == nullptr) return;
    EXPECT_TRUE(server_->Running()) << server_->Log();
    // And it still answers a caller with the token exactly.
    ClientOptions security;
    security.auth_token = kToken;
    std::unique_ptr<Client> client =
        MakeClient(server_->target(), 1, kCallDeadline, security);
    ExpectServedExactly(*client);
  }

  std::string token_file_;
  std::unique_ptr<ServerProcess> server_;
  int64_t rss_before_ = 0;
};

TEST_F(TokenServerTest, HeaderOnlyCallsWithoutTheTokenEndAtOnceWithLittleRss) {
  constexpr int kConnections = 20;
  constexpr int kCallsPerConnection = 150;
  int ended = 0;
  for (int c = 0; c < kConnections; ++c) {
    absl::StatusOr<std::unique_ptr<RawHttp2>> h2 =
        RawHttp2::Connect(server_->port());
    ASSERT_TRUE(h2.ok()) << h2.status();
    for (int i = 0; i < kCallsPerConnection; ++i) {
      ASSERT_TRUE((*h2)->OpenCall(kComputeLoss).ok());
      // Read as we go, so the server's answers never back up.
      if (i % 16 == 15) {
        ASSERT_TRUE((*h2)->Pump(absl::ZeroDuration()).ok());
      }
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while ((*h2)->ended_streams() < kCallsPerConnection &&
           absl::Now() < deadline && !(*h2)->closed()) {
      ASSERT_TRUE((*h2)->Pump(absl::Milliseconds(50)).ok());
    }
    ended += (*h2)->ended_streams();
  }
  // Every call ended by the server, none waiting for a message.
  EXPECT_EQ(ended, kConnections * kCallsPerConnection);
  const int64_t growth = RssGrowthKiB(*server_, rss_before_);
  EXPECT_LT(growth, 64 * 1024) << "RSS grew by " << growth << " KiB";
}

TEST_F(TokenServerTest, AnUploadWithoutTheTokenIsRefusedBeforeItsMessage) {
  std::vector<std::unique_ptr<RawHttp2>> uploads(12);
  for (std::unique_ptr<RawHttp2>& upload : uploads) {
    ASSERT_NO_FATAL_FAILURE(ExpectUploadEndsAtItsHeaders(
        server_->port(), kComputeLoss, 60u << 20, upload));
  }
}

// gRPC 1.51 takes a message in whole, up to --transport_memory_bytes, before
// it holds it to --max_message_bytes: health, open without the token, let
// an unauthenticated peer fill the transport's memory with one call (one
// announced at 4 GiB held 4.1 GB). With --health_needs_token such a call
// ends at its headers, as every other method's does.
TEST(HealthNeedsTokenTest,
     AHealthUploadWithoutTheTokenIsRefusedBeforeItsMessage) {
  std::string token_file;
  ASSERT_NO_FATAL_FAILURE(WriteTokenFile(token_file));
  ClientOptions probe;
  probe.auth_token = kToken;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--auth_token_file=" + token_file, "--health_needs_token"},
      absl::Seconds(20), probe);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<RawHttp2> upload;
  ASSERT_NO_FATAL_FAILURE(ExpectUploadEndsAtItsHeaders(
      (*server)->port(), "/grpc.health.v1.Health/Check", 0xffffffffu, upload));
  std::unique_ptr<Client> client =
      MakeClient((*server)->target(), 1, kCallDeadline, probe);
  ExpectServedExactly(*client);
}

TEST_F(TokenServerTest, RapidResetsLeaveTheServerServingWithBoundedRss) {
  constexpr int kConnections = 20;
  constexpr int kResetsPerConnection = 500;
  for (int c = 0; c < kConnections; ++c) {
    absl::StatusOr<std::unique_ptr<RawHttp2>> h2 =
        RawHttp2::Connect(server_->port());
    ASSERT_TRUE(h2.ok()) << h2.status();
    for (int i = 0; i < kResetsPerConnection && !(*h2)->closed(); ++i) {
      absl::StatusOr<uint32_t> stream = (*h2)->OpenCall(
          kComputeLoss, {{"authorization", std::string("Bearer ") + kToken}});
      if (!stream.ok() || !(*h2)->Reset(*stream).ok()) break;
      if (i % 32 == 31) {
        ASSERT_TRUE((*h2)->Pump(absl::ZeroDuration()).ok());
      }
    }
  }
  const int64_t growth = RssGrowthKiB(*server_, rss_before_);
  EXPECT_LT(growth, 128 * 1024) << "RSS grew by " << growth << " KiB";
}

// gRPC 1.51 inflates a compressed message whole before it holds it to
// --max_message_bytes, outside the memory quota: 3 MB of gzip held 3.7 GB,
// and through health, which needs no token. The server takes identity
// alone, so such a call ends at its headers, whatever its message would
// inflate to.
TEST_F(TokenServerTest, CompressedMessagesEndAtTheirHeaders) {
  // 256 MiB of zeros: a few hundred KB once the client has compressed them.
  const std::string zeros(256 << 20, '\0');
  std::shared_ptr<grpc::Channel> channel = ChannelTo(server_->target());
  for (const grpc_compression_algorithm algorithm :
       {GRPC_COMPRESS_GZIP, GRPC_COMPRESS_DEFLATE}) {
    EXPECT_TRUE(HasCode(RawUnary(*channel, "/grpc.health.v1.Health/Check",
                                 zeros, "", algorithm),
                        grpc::StatusCode::UNIMPLEMENTED, "is disabled"));
    EXPECT_TRUE(
        HasCode(RawUnary(*channel, kComputeLoss, zeros, kToken, algorithm),
                grpc::StatusCode::UNIMPLEMENTED, "is disabled"));
  }
  absl::StatusOr<int64_t> peak = server_->PeakRssKiB();
  ASSERT_TRUE(peak.ok());
  EXPECT_LT(*peak - rss_before_, 64 * 1024)
      << "VmHWM " << *peak << " KiB, VmRSS before " << rss_before_ << " KiB";
}

TEST_F(TokenServerTest, ReflectionNeedsTheToken) {
  // ServerReflectionRequest{list_services: ""}: field 7, length 0.
  const std::string list_services("\x3a\x00", 2);
  constexpr char kReflection[] =
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  std::shared_ptr<grpc::Channel> channel = ChannelTo(server_->target());
  EXPECT_TRUE(HasCode(RawBidi(*channel, kReflection, {list_services}).status,
                      grpc::StatusCode::UNAUTHENTICATED, "authorization"));
  const RawStreamOutcome with_token =
      RawBidi(*channel, kReflection, {list_services}, kToken);
  ASSERT_TRUE(with_token.status.ok()) << Describe(with_token.status);
  ASSERT_EQ(with_token.responses.size(), 1u);
  EXPECT_TRUE(
      absl::StrContains(with_token.responses[0], "klserve.v1.IndexerKl"));
}

// A projections-form stream's header declares its query rows' shapes with
// no bytes behind them, so T can be anything: 2^50 rows here. Under
// MEAN_VALID without row_valid, N is counted as the header arrives; with
// the causal cut alone deciding the rows' keys it comes in closed form. It
// had walked the 2^50 rows, unstoppably, holding compute threads for good.
TEST(ProjectionsStreamHeaderTest, AQuadrillionRowsAreCountedAtOnce) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--threads=1", "--max_concurrent_requests=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  const auto floats = [](std::vector<int64_t> shape) {
    v1::Tensor tensor;
    tensor.set_dtype("FP32");
    int64_t n = 1;
    for (const int64_t d : shape) {
      tensor.add_shape(d);
      n *= d;
    }
    tensor.set_data(std::string(4 * n, '\0'));
    return tensor;
  };
  const auto spec = [](std::vector<int64_t> shape) {
    v1::TensorSpec tensor;
    tensor.set_dtype("FP32");
    for (const int64_t d : shape) tensor.add_shape(d);
    return tensor;
  };
  constexpr int64_t kT = int64_t{1} << 50;
  v1::ComputeLossStreamRequest header;
  v1::StreamHeader& h = *header.mutable_header();
  h.mutable_options()->set_causal(true);
  h.mutable_options()->set_reduction(v1::REDUCTION_MEAN_VALID);
  h.mutable_options()->set_skip_grad(true);
  *h.mutable_query() = spec({1, kT, 1, 1});
  *h.mutable_index_query() = spec({1, kT, 1, 1});
  *h.mutable_index_weights() = spec({1, kT, 1});
  *h.mutable_key() = floats({1, 8, 1, 1});
  *h.mutable_index_key() = floats({1, 8, 1});
  v1::ComputeLossStreamRequest block;
  v1::RowBlock& b = *block.mutable_block();
  b.set_num_rows(1);
  b.set_query(std::string(4, '\0'));
  b.set_index_query(std::string(4, '\0'));
  b.set_index_weights(std::string(4, '\0'));

  std::shared_ptr<grpc::Channel> channel = ChannelTo((*server)->target());
  const absl::Time start = absl::Now();
  const RawStreamOutcome outcome =
      RawBidi(*channel, kComputeLossStream,
              {header.SerializeAsString(), block.SerializeAsString()});
  // The one block is answered; the stream then ends short of its rows.
  EXPECT_TRUE(HasCode(outcome.status, grpc::StatusCode::INVALID_ARGUMENT,
                      "the blocks covered rows [0, 1)"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  ExpectServedExactly(*client);
}

// gRPC's reflection service is synchronous: each open stream holds a server
// thread for its life (1,500 open streams had taken 1,534 threads). Past
// --max_reflection_threads (one of them the poller) new reflection calls
// are RESOURCE_EXHAUSTED, the loss is served exactly meanwhile, and once the
// streams close reflection answers again.
TEST(ReflectionThreadsTest, OpenReflectionStreamsAreBounded) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_reflection_threads=3"});
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr char kReflection[] =
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  const std::string list_services("\x3a\x00", 2);
  std::shared_ptr<grpc::Channel> channel = ChannelTo((*server)->target());
  struct OpenStream {
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream;
  };
  std::vector<std::unique_ptr<OpenStream>> open;
  int served = 0, refused = 0;
  for (int i = 0; i < 6; ++i) {
    auto s = std::make_unique<OpenStream>();
    s->context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    s->stream = std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer,
                                                  grpc::ByteBuffer>::
            Create(channel.get(),
                   grpc::internal::RpcMethod(
                       kReflection, grpc::internal::RpcMethod::BIDI_STREAMING),
                   &s->context));
    grpc::ByteBuffer response;
    if (s->stream->Write(BytesOf(list_services)) &&
        s->stream->Read(&response)) {
      ++served;  // left open: it keeps its thread
      open.push_back(std::move(s));
    } else {
      EXPECT_TRUE(
          HasCode(s->stream->Finish(), grpc::StatusCode::RESOURCE_EXHAUSTED));
      ++refused;
    }
  }
  EXPECT_GE(served, 1);
  EXPECT_LE(served, 2);
  EXPECT_EQ(served + refused, 6);
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  ExpectServedExactly(*client);
  for (std::unique_ptr<OpenStream>& s : open) {
    s->stream->WritesDone();
    EXPECT_TRUE(s->stream->Finish().ok());
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  RawStreamOutcome again = RawBidi(*channel, kReflection, {list_services});
  while (!again.status.ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
    again = RawBidi(*channel, kReflection, {list_services});
  }
  EXPECT_TRUE(again.status.ok()) << Describe(again.status);
}

// gRPC 1.51 announces the cap, and a client that has acknowledged it and
// opens more streams commits a connection error: the server closes the
// connection, the calls on it end, and the server keeps serving others.
TEST(StreamsPerConnectionTest, StreamsPastTheCapCloseTheConnectionOnly) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_streams_per_connection=8"});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<RawHttp2>> h2 =
      RawHttp2::Connect((*server)->port());
  ASSERT_TRUE(h2.ok()) << h2.status();
  // Reads the server's SETTINGS and acknowledges them.
  ASSERT_TRUE((*h2)->Pump(absl::Milliseconds(300)).ok());
  EXPECT_EQ((*h2)->max_concurrent_streams(), 8u);
  int opened = 0;
  // A write fails once the server has closed the connection.
  while (opened < 40 && (*h2)->OpenCall(kComputeLoss).ok()) ++opened;
  EXPECT_GT(opened, 8);
  ASSERT_TRUE((*h2)->Pump(absl::Seconds(5)).ok());
  EXPECT_TRUE((*h2)->closed()) << "the connection outlived the cap";
  h2->reset();
  // The server still serves, exactly.
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  ExpectServedExactly(*client);
  EXPECT_TRUE((*server)->Running());
}

// ---------------------------------------------------------------------------
// Item 5: a response within a few bytes of the message limit is refused
// before it is computed or counted.

// Dense BF16 [1, T, S] with an FP32 gradient and row_kl: the response
// (4TS + 8T bytes of tensors) outgrows the request (4TS) by 8T, so with the
// limit at 4TS + 8T + 2 the request fits and the response's tensors fit,
// but not the response's encoding.
constexpr int64_t kT = 16, kS = 256;
constexpr int64_t kNearLimit = 4 * kT * kS + 8 * kT + 2;

v1::ComputeLossRequest NearLimitRequest() {
  ProblemSpec s;
  s.name = "near-limit";
  s.B = 1, s.T = kT, s.S = kS, s.H = 0;
  s.target_dtype = s.scores_dtype = "BF16";
  s.options.set_want_row_kl(true);
  v1::ComputeLossRequest request = MakeRequest(s);
  request.mutable_tags()->set_run("near-limit");
  request.mutable_tags()->set_step(1);
  return request;
}

// The near-limit problem in blocks of half its rows goes through, exactly.
void ExpectSmallerBlocksGoThrough(Client& client) {
  const v1::ComputeLossRequest request = NearLimitRequest();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok());
  absl::StatusOr<v1::ComputeLossResponse> blocks =
      client.ComputeLossStreaming(request, kT / 2);
  ASSERT_TRUE(blocks.ok()) << Describe(blocks.status());
  EXPECT_TRUE(SameResponse(*expected, *blocks));
}

TEST(MessageLimitTest, ResponsesPastTheLimitAreRefusedAndNotCounted) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {absl::StrCat("--max_message_bytes=", kNearLimit), "--enable_echo"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = (*server)->metrics_port();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  const v1::ComputeLossRequest request = NearLimitRequest();
  ASSERT_LE(static_cast<int64_t>(request.ByteSizeLong()), kNearLimit);

  EXPECT_TRUE(HasCode(client->ComputeLossUnary(request).status(),
                      absl::StatusCode::kResourceExhausted, "grad"));
  EXPECT_TRUE(HasCode(client->ComputeLossStreaming(request, kT).status(),
                      absl::StatusCode::kResourceExhausted, "num_rows"));
  EXPECT_TRUE(HasCode(client->EchoStream(1, 0, kNearLimit).status(),
                      absl::StatusCode::kResourceExhausted, "reply_bytes"));
  // Nothing reached the step: the run was never seen.
  EXPECT_TRUE(HasCode(client->FinishStep("near-limit", 1).status(),
                      absl::StatusCode::kNotFound));
  const std::string scrape = ScrapeMetrics(metrics_port);
  EXPECT_EQ(SeriesValue(scrape,
                        "klserve_requests_total{code=\"RESOURCE_EXHAUSTED\","
                        "method=\"ComputeLoss\"}"),
            1)
      << scrape;
  EXPECT_EQ(
      SeriesValue(scrape,
                  "klserve_requests_total{code=\"OK\",method=\"ComputeLoss\"}"),
      0);

  ExpectSmallerBlocksGoThrough(*client);
}

// A request past the server's limit says whose limit it met and what gets
// past it; gRPC's own words named neither (found by an ML-engineer helper).
TEST(MessageLimitTest, ARequestPastTheLimitNamesTheFlagAndStreaming) {
  constexpr int64_t kLimit = kNearLimit / 2;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({absl::StrCat("--max_message_bytes=", kLimit)});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  EXPECT_TRUE(HasCode(
      client->ComputeLossUnary(NearLimitRequest()).status(),
      absl::StatusCode::kResourceExhausted,
      absl::StrCat("(the server's --max_message_bytes is ", kLimit,
                   " bytes: klctl --stream=always, or a --stream_threshold "
                   "below it, sends the tensors in blocks of --block_bytes")));
  // Streamed in blocks below the limit, it goes through.
  EXPECT_TRUE(client->ComputeLossStreaming(NearLimitRequest(), kT / 4).ok());
}

// A message over the limit is refused by gRPC before the service reads it:
// the client sees RESOURCE_EXHAUSTED. A stream's reactor learns only that
// gRPC ended the call, as for a cancel; it had taken the read's end for the
// client closing its side and counted a stream cut short, INVALID_ARGUMENT.
// A unary call never reaches the service.
TEST(MessageLimitTest, AStreamMessageOverTheLimitIsNotCountedAsCutShort) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({absl::StrCat("--max_message_bytes=", kNearLimit)});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  for (const bool header_first : {false, true}) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    auto stream = stub->ComputeLossStream(&context);
    if (header_first) {
      const v1::ComputeLossRequest request = NearLimitRequest();
      absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
      ASSERT_TRUE(slicer.ok()) << slicer.status();
      v1::ComputeLossStreamRequest header;
      *header.mutable_header() = slicer->MakeHeader();
      stream->Write(header);
    }
    v1::ComputeLossStreamRequest block;
    block.mutable_block()->set_num_rows(1);
    block.mutable_block()->set_indexer_scores(
        std::string(2 * kNearLimit, '\0'));
    stream->Write(block);
    stream->WritesDone();
    v1::ComputeLossStreamResponse ignored;
    while (stream->Read(&ignored)) {
    }
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::ComputeLossRequest request = NearLimitRequest();
    request.mutable_indexer_scores()->set_data(
        std::string(2 * kNearLimit, '\0'));
    v1::ComputeLossResponse response;
    const grpc::Status status = stub->ComputeLoss(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
  }
  // A call is counted once its reactor is done, which may be a moment after
  // the client has its status.
  const std::string cancelled =
      "klserve_requests_total{code=\"CANCELLED\",method=\"ComputeLossStream\"}";
  std::string scrape = ScrapeMetrics((*server)->metrics_port());
  for (const absl::Time give_up = absl::Now() + absl::Seconds(5);
       SeriesValue(scrape, cancelled) < 2 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(20));
    scrape = ScrapeMetrics((*server)->metrics_port());
  }
  EXPECT_EQ(SeriesValue(scrape, cancelled), 2) << scrape;
  // The unary call never reached the service: no code counts it.
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (absl::StartsWith(line, "klserve_requests_total{") &&
        absl::StrContains(line, "method=\"ComputeLoss\"}")) {
      EXPECT_TRUE(absl::EndsWith(line, " 0")) << line;
    }
  }
  // Absent (-1) or 0.
  EXPECT_LE(SeriesValue(scrape,
                        "klserve_requests_total{code=\"INVALID_ARGUMENT\","
                        "method=\"ComputeLossStream\"}"),
            0);
  ExpectSmallerBlocksGoThrough(*MakeClient((*server)->target()));
}

// ---------------------------------------------------------------------------
// The projections form: what a small request could make the server hold
// (session of 2026-12-02). Each case ran the server out of memory, or held
// a hundred times the request, before its fix.

// A projections-form StreamHeader (the query side as specs, the key side
// whole) of one key and one head, the query's H and D and the options given.
v1::StreamHeader ProjectionsHeader(int64_t T, int64_t H, int64_t D,
                                   const v1::LossOptions& options) {
  ProjectionsSpec spec;
  spec.name = "header";
  spec.T = 1, spec.S = 1, spec.H = 1, spec.H_kv = 1, spec.D = D;
  spec.H_I = 1, spec.D_I = 1;
  spec.options = options;
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  EXPECT_TRUE(slicer.ok()) << slicer.status();
  v1::StreamHeader header = slicer->MakeHeader();
  const auto set = [](v1::TensorSpec* tensor,
                      std::initializer_list<int64_t> shape) {
    tensor->clear_shape();
    for (int64_t dim : shape) tensor->add_shape(dim);
  };
  set(header.mutable_query(), {1, T, H, D});
  set(header.mutable_index_query(), {1, T, 1, 1});
  set(header.mutable_index_weights(), {1, T, 1});
  return header;
}

// The status of a stream that sends `header` and then, unless the header is
// refused first, one block of one row of zeros.
grpc::Status StreamWithHeader(v1::IndexerKl::Stub& stub,
                              const v1::StreamHeader& header,
                              int64_t query_row_bytes) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto stream = stub.ComputeLossStream(&context);
  v1::ComputeLossStreamRequest message;
  *message.mutable_header() = header;
  stream->Write(message);
  message.Clear();
  v1::RowBlock* block = message.mutable_block();
  block->set_num_rows(1);
  block->set_query(std::string(query_row_bytes, '\0'));
  block->set_index_query(std::string(4, '\0'));
  block->set_index_weights(std::string(4, '\0'));
  stream->Write(message);
  stream->WritesDone();
  v1::ComputeLossStreamResponse ignored;
  while (stream->Read(&ignored)) {
  }
  return stream->Finish();
}

TEST(ProjectionsAmplificationTest, AUnaryCallHoldsNoTileOfItsRows) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  // One query row of 4 MiB (and a key of 4 MiB): a tile's room for it was
  // 512 MiB.
  ProjectionsSpec spec;
  spec.name = "LongRow";
  spec.T = 1, spec.S = 1, spec.H = 1, spec.H_kv = 1, spec.D = 1 << 20;
  spec.H_I = 1, spec.D_I = 1;
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  absl::StatusOr<v1::ComputeLossResponse> response =
      client->ComputeLossUnary(request);
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  // With one key, q_I's softmax and the target are both 1: KL 0.
  EXPECT_EQ(response->result().loss(), 0.0);
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 128 * 1024) << "RSS grew by " << growth << " KiB";
}

TEST(ProjectionsAmplificationTest, AStreamRefusesATileItCouldNotHold) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_message_bytes=2097152"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  // A query row of 4 MiB (H = 2^20 heads of one dimension): a tile of it
  // (one row, at these widths) is over the 2 MiB message limit. With tiles
  // of 128 rows and the default limit, the server took 512 MiB of room at
  // the first block.
  constexpr int64_t kH = int64_t{1} << 20;
  grpc::Status status = StreamWithHeader(
      *stub, ProjectionsHeader(128, kH, 1, v1::LossOptions()), kH * 4);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "query: a tile of 1 "))
      << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "--max_message_bytes"))
      << status.error_message();
  // With H = 2^30 the server died: a row's heads alone are 28 GiB of a
  // thread's scratch.
  status = StreamWithHeader(
      *stub, ProjectionsHeader(128, int64_t{1} << 30, 1, v1::LossOptions()), 4);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "query: a tile of 1 "))
      << status.error_message();
  EXPECT_TRUE(
      absl::StrContains(status.error_message(), "--max_thread_scratch_bytes"))
      << status.error_message();
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 128 * 1024) << "RSS grew by " << growth << " KiB";
  EXPECT_TRUE((*server)->Running());
}

TEST(ProjectionsAmplificationTest, AHugeTopkIsRefusedBeforeItsAnswerIsMade) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  // A tile's answer of 16 rows: 640 MB of topk_indices, under the tensor
  // limit and over the message limit (it took 5.7 GB to find out), and
  // 128 GiB (bad_alloc on a gRPC thread: the stream hung, and so did the
  // drain at SIGTERM).
  for (const int64_t topk : {int64_t{10'000'000}, (int64_t{1} << 31) - 1}) {
    v1::LossOptions options;
    options.set_topk(topk);
    options.set_skip_grad(true);
    const grpc::Status status =
        StreamWithHeader(*stub, ProjectionsHeader(16, 1, 1, options), 4);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
    // The answer of a tile (of 16 rows) over the message limit, or (a
    // tile of one row) what a thread would hold for it.
    EXPECT_TRUE(absl::StartsWith(status.error_message(), "topk_indices:") ||
                absl::StartsWith(status.error_message(), "topk: a tile of"))
        << status.error_message();
  }
  // Unary: [1, 1, 2^28] is the 1 GiB tensor limit, and four times the
  // message limit.
  ProjectionsSpec spec;
  spec.name = "HugeTopk";
  spec.T = 1, spec.S = 1;
  spec.options.set_topk(int64_t{1} << 28);
  const absl::Status unary =
      client->ComputeLossUnary(MakeProjectionsRequest(spec)).status();
  EXPECT_TRUE(HasCode(unary, absl::StatusCode::kResourceExhausted,
                      "topk_indices: the response would carry"));
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 128 * 1024) << "RSS grew by " << growth << " KiB";
  // Nothing is left hanging: the server drains and exits at once.
  (*server)->Signal(SIGTERM);
  EXPECT_TRUE((*server)->WaitForExit(absl::Seconds(10)).has_value());
}

// What ASan's quarantine may keep of what the server frees (256 MiB by
// default) before reusing it: the RSS after a wide call, and its peak
// during one, stay that much higher in the sanitizer build.
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kQuarantineKiB = 256 * 1024;
#else
constexpr int64_t kQuarantineKiB = 0;
#endif

// A projections problem of S keys and T query rows, every head one wide:
// a message of about 8 (T + S) bytes.
ProjectionsSpec ManyKeys(int64_t T, int64_t S) {
  ProjectionsSpec spec;
  spec.name = "ManyKeys";
  spec.T = T, spec.S = S;
  spec.H = 1, spec.H_kv = 1, spec.D = 1;
  spec.H_I = 1, spec.D_I = 1;
  return spec;
}

// A unary answer waits in memory until its client takes it, after its call
// has given its slot back: a client that opened no flow-control window made
// the server keep every answer it asked for (240 answers of 4 MiB held
// 1.09 GB). Now once the answers waiting take --max_concurrent_requests
// times --max_message_bytes (here 2 x 8 MiB), later calls are refused to be
// retried, and an answer untaken for --stream_idle_timeout is cancelled.
// The raw client reads frames but never opens a window beyond HTTP/2's
// initial 64 KiB.
TEST(UnreadAnswerTest, AnswersLeftUntakenAreCancelledWithBoundedRss) {
  constexpr int kCalls = 30;  // under --max_streams_per_connection
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--max_concurrent_requests=2", "--max_message_bytes=8MiB",
       "--stream_idle_timeout=3s", "--release_memory_after_idle=0"});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  // A request of about 40 KB whose answer carries the service's top-k
  // selection of every key: 256 rows of 4096 INT32s, 4 MiB.
  ProjectionsSpec spec = ManyKeys(256, 4096);
  spec.options.set_topk(4096);
  spec.options.set_skip_grad(true);
  const std::string request = MakeProjectionsRequest(spec).SerializeAsString();
  absl::StatusOr<std::unique_ptr<RawHttp2>> h2 =
      RawHttp2::Connect((*server)->port());
  ASSERT_TRUE(h2.ok()) << h2.status();
  std::vector<uint32_t> streams;
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<uint32_t> stream = (*h2)->OpenCall(kComputeLoss);
    ASSERT_TRUE(stream.ok()) << stream.status();
    ASSERT_TRUE((*h2)
                    ->SendMessage(*stream, request,
                                  static_cast<uint32_t>(request.size()),
                                  /*end_stream=*/true)
                    .ok());
    streams.push_back(*stream);
    ASSERT_TRUE((*h2)->Pump(absl::Milliseconds(100)).ok());
  }
  // 30 answers would be 120 MiB; four or five wait (until they take
  // 16 MiB), and the later calls were refused.
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 64 * 1024 + kQuarantineKiB)
      << "RSS grew by " << growth << " KiB";
  // Every call ends: the refused at once, the answered once they have
  // waited for the idle timeout (a reset).
  ASSERT_TRUE((*h2)->Pump(absl::Seconds(5)).ok());
  int reset = 0;
  for (uint32_t stream : streams) {
    EXPECT_TRUE((*h2)->end(stream).ended) << "stream " << stream;
    reset += (*h2)->end(stream).reset ? 1 : 0;
  }
  EXPECT_GE(reset, 1);
  EXPECT_LE(reset, 6);
  const std::string metrics = ScrapeMetrics((*server)->metrics_port());
  EXPECT_TRUE(absl::StrContains(
      metrics, absl::StrCat("klserve_untaken_answers_cancelled_total ", reset)))
      << metrics;
  // Meanwhile others are served, bit for bit.
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  ExpectServedExactly(*client);
  EXPECT_TRUE((*server)->Running());
}

// A tagged call whose deadline passes while it computes is answered to
// nobody, so it adds nothing to its step: its job retries it, and it used to
// count twice (a helper's finding: 3 calls past their deadlines were all in
// their step, and recorded OK). One projections tile of 16 rows whose
// computing is most of the call, under a deadline of half what the same call
// took: it passes inside the tile, after the last check between tiles.
TEST(DeadlineTest, ATaggedCallPastItsDeadlineCountsInNoStep) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  // Keys enough for the call to take 200 ms (about 1 s on 2 cores at S =
  // 16384): a faster machine gets more.
  ProjectionsSpec spec;
  spec.name = "slow";
  spec.T = 16;
  spec.H = 128, spec.H_kv = 1, spec.D = 128;
  spec.H_I = 4, spec.D_I = 64;
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  v1::ComputeLossRequest request;
  absl::Duration took;
  int timed_calls = 0;
  for (spec.S = 16384; spec.S <= 131072; spec.S *= 2) {
    ++timed_calls;
    request = MakeProjectionsRequest(spec);
    request.mutable_tags()->set_step(1);
    request.mutable_tags()->set_run(absl::StrCat("timed", spec.S));
    const absl::Time start = absl::Now();
    ASSERT_TRUE(client->ComputeLossUnary(request).ok());
    took = absl::Now() - start;
    if (took >= absl::Milliseconds(200)) break;
  }
  if (took < absl::Milliseconds(200)) {
    GTEST_SKIP() << "too fast for a deadline to fall inside its computing";
  }
  const std::string timed = request.tags().run();

  // The deadline falls inside the computing unless the machine has become
  // more than twice as fast since it was timed (another test's load gone):
  // then the call is answered, and the next, under another run, gets half
  // the time.
  int late_answered = 0;
  absl::Duration deadline = took / 2;
  std::string late;
  for (int attempt = 0;; ++attempt) {
    late = absl::StrCat("late", attempt);
    request.mutable_tags()->set_run(late);
    std::unique_ptr<Client> hasty =
        MakeClient((*server)->target(), /*max_attempts=*/1, deadline);
    const absl::Status status = hasty->ComputeLossUnary(request).status();
    if (status.code() == absl::StatusCode::kDeadlineExceeded) break;
    ASSERT_TRUE(status.ok()) << Describe(status);
    ASSERT_LT(attempt, 3) << "every call beat its deadline";
    ++late_answered;
    deadline /= 2;
  }
  // The server computes to the end, then drops the answer, uncounted.
  const std::string cancelled =
      "klserve_requests_total{code=\"CANCELLED\",method=\"ComputeLoss\"}";
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (SeriesValue(ScrapeMetrics((*server)->metrics_port()), cancelled) < 1 &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::string metrics = ScrapeMetrics((*server)->metrics_port());
  EXPECT_EQ(SeriesValue(metrics, cancelled), 1) << metrics;
  EXPECT_EQ(SeriesValue(metrics,
                        "klserve_requests_total{code=\"OK\",method="
                        "\"ComputeLoss\"}"),
            timed_calls + late_answered)
      << metrics;
  EXPECT_EQ(client->FinishStep(late, 1).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<v1::FinishStepResponse> finished =
      client->FinishStep(timed, 1);
  ASSERT_TRUE(finished.ok()) << Describe(finished.status());
  EXPECT_EQ(finished->requests(), 1);
}

// A stream that fails while its answer waits for a client that does not
// read it keeps its slot until the answer is taken, or the idle timeout
// cancels it: it holds that answer and its blocks until then. It used to
// give the slot back at once, and a client failing streams without reading
// made 30 of them hold 330 MB against a bound of 64 MB (a helper's attack).
TEST(UnreadAnswerTest, AStreamFailedBehindAnUntakenAnswerKeepsItsSlot) {
  constexpr int kStreams = 2;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({absl::StrCat("--max_open_streams=", kStreams),
                            "--stream_idle_timeout=2s"});
  ASSERT_TRUE(server.ok()) << server.status();
  // A block of 16 rows of 4096 keys is answered with a 256 KiB gradient,
  // past the 64 KiB a raw client that sends no WINDOW_UPDATE can take.
  const v1::ComputeLossRequest wide = MakeRequest(WideSpec(64, 5));
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(wide);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  const std::string header = HeaderMessage(*slicer).SerializeAsString();
  const std::string block = BlockMessage(*slicer, 0, 16).SerializeAsString();
  absl::StatusOr<std::unique_ptr<RawHttp2>> h2 =
      RawHttp2::Connect((*server)->port());
  ASSERT_TRUE(h2.ok()) << h2.status();
  std::vector<uint32_t> streams;
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<uint32_t> stream =
        (*h2)->OpenCall("/klserve.v1.IndexerKl/ComputeLossStream");
    ASSERT_TRUE(stream.ok()) << stream.status();
    // The header, the block, and the block again: its rows overlap, and
    // the stream fails with its answer still in flight.
    for (const std::string* message : {&header, &block, &block}) {
      ASSERT_TRUE((*h2)
                      ->SendMessage(*stream, *message,
                                    static_cast<uint32_t>(message->size()),
                                    /*end_stream=*/false)
                      .ok());
      ASSERT_TRUE((*h2)->Pump(absl::Milliseconds(200)).ok());
    }
    streams.push_back(*stream);
  }
  for (uint32_t stream : streams) {
    EXPECT_FALSE((*h2)->end(stream).ended) << "stream " << stream;
  }
  // Their slots are still taken.
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  RawStream refused = OpenStream(*stub);
  EXPECT_TRUE(HasCode(refused.stream->Finish(),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "--max_open_streams"));
  // The idle timeout cancels their answers, and the slots come back.
  ASSERT_TRUE((*h2)->Pump(absl::Seconds(4)).ok());
  for (uint32_t stream : streams) {
    EXPECT_TRUE((*h2)->end(stream).ended) << "stream " << stream;
  }
  std::unique_ptr<Client> client =
      MakeClient((*server)->target(), /*max_attempts=*/1);
  const v1::ComputeLossRequest request = Small();
  absl::StatusOr<v1::ComputeLossResponse> expected = LibraryCompute(request);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<v1::ComputeLossResponse> served =
      client->ComputeLossStreaming(request);
  ASSERT_TRUE(served.ok()) << Describe(served.status());
  EXPECT_TRUE(SameResponse(*expected, *served));
  EXPECT_TRUE((*server)->Running());
}

// A dense tile held [128, S] floats three times over in every compute
// thread: a 17 MB request of 2^21 keys and 64 rows took 1.8 GB, one of 2^24
// keys would have taken 28 GB a thread, and what a tile took stayed with
// the allocator after the answer. Tiles now take fewer rows as S grows.
TEST(ProjectionsAmplificationTest, ManyKeysTakeTilesOfFewRowsAndGiveThemBack) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  absl::StatusOr<v1::ComputeLossResponse> response = client->ComputeLossUnary(
      MakeProjectionsRequest(ManyKeys(64, int64_t{1} << 21)));
  ASSERT_TRUE(response.ok()) << Describe(response.status());
  EXPECT_TRUE(std::isfinite(response->result().loss()));
  absl::StatusOr<int64_t> peak = (*server)->PeakRssKiB();
  ASSERT_TRUE(peak.ok());
  // The request and its answer (about 50 MB in all, a few copies of it in
  // gRPC and the service) and two threads' tiles of one row: about 220 MB.
  // Under ASan the copies freed during the call stay resident in its
  // quarantine, and the peak reached 526 MB.
  EXPECT_LT(*peak - *before, 512 * 1024 + kQuarantineKiB)
      << "VmHWM " << *peak << " KiB, VmRSS before " << *before << " KiB";
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 128 * 1024 + kQuarantineKiB)
      << "RSS grew by " << growth << " KiB";
}

// A tile's buffers for one step over the keys were kKeyTile (512) keys wide
// whatever S, while its memory bound counted min(512, S): with S = 1 and
// 2^18 indexer heads a 4 MB request, let through by a 64 MiB limit, made
// the one compute thread hold 1.09 GB (the service's selection, and the
// dense tile's gradients as much). They are now as wide as the bound says.
TEST(ProjectionsAmplificationTest,
     FewKeysTakeBuffersAsWideAsTheKeysWithBoundedRss) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--threads=1", "--max_thread_scratch_bytes=64MiB"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  for (const bool select : {false, true}) {
    ProjectionsSpec spec = ManyKeys(2, 1);
    spec.H_I = int64_t{1} << 18;
    if (select) spec.options.set_topk(1);
    absl::StatusOr<v1::ComputeLossResponse> response =
        client->ComputeLossUnary(MakeProjectionsRequest(spec));
    ASSERT_TRUE(response.ok()) << Describe(response.status());
    EXPECT_TRUE(std::isfinite(response->result().loss()));
  }
  absl::StatusOr<int64_t> peak = (*server)->PeakRssKiB();
  ASSERT_TRUE(peak.ok());
  // The request and its answer (4 MB each, a few copies of them in gRPC and
  // the service) and the tile, within its 64 MiB.
  EXPECT_LT(*peak - *before, 192 * 1024)
      << "VmHWM " << *peak << " KiB, VmRSS before " << *before << " KiB";
}

// A call computed part of its tiles on its own thread, one per call in
// flight, besides the pool's --threads: each grew a thread's scratch, so 8
// calls of tiles just under a 64 MiB limit held 353 MB with --threads=1.
// The calls now only wait, and the pool's threads alone compute.
TEST(ProjectionsAmplificationTest,
     ConcurrentCallsComputeOnTheThreadsAloneWithBoundedRss) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--threads=1", "--max_thread_scratch_bytes=64MiB",
       "--max_concurrent_requests=8", "--release_memory_after_idle=0"});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  ProjectionsSpec spec = ManyKeys(64, int64_t{1} << 18);
  spec.options.set_causal(true);
  spec.options.set_skip_grad(true);
  const v1::ComputeLossRequest request = MakeProjectionsRequest(spec);
  std::vector<std::thread> calls;
  std::vector<absl::Status> statuses(8);
  for (absl::Status& status : statuses) {
    calls.emplace_back([&] {
      status =
          MakeClient((*server)->target())->ComputeLossUnary(request).status();
    });
  }
  for (std::thread& call : calls) call.join();
  for (const absl::Status& status : statuses) {
    EXPECT_TRUE(status.ok()) << Describe(status);
  }
  absl::StatusOr<int64_t> peak = (*server)->PeakRssKiB();
  ASSERT_TRUE(peak.ok());
  // One thread's tiles (64 MiB) and eight 2 MB requests with their copies.
  EXPECT_LT(*peak - *before, 160 * 1024)
      << "VmHWM " << *peak << " KiB, VmRSS before " << *before << " KiB";
}

// The logits form's row scratch is about 41 bytes a slot in each compute
// thread, from as few as 4 bytes of input a slot: a 64 MB request of one row
// took 432 MB, with no flag over it. A row now takes at most
// --max_thread_scratch_bytes, in the unary call and at the stream's header.
TEST(LogitsAmplificationTest, ARowOverTheThreadScratchLimitIsRefused) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_thread_scratch_bytes=64MiB"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  ProblemSpec wide;
  wide.name = "WideRow";
  wide.T = 1, wide.S = int64_t{1} << 21, wide.H = 0;
  wide.target_dtype = wide.scores_dtype = "BF16";
  const v1::ComputeLossRequest request = MakeRequest(wide);
  const absl::Status unary = client->ComputeLossUnary(request).status();
  EXPECT_TRUE(HasCode(unary, absl::StatusCode::kResourceExhausted,
                      "indexer_scores: a row of 2097152 slots needs "))
      << unary;
  EXPECT_TRUE(absl::StrContains(unary.message(),
                                "over the limit of 67108864 "
                                "(--max_thread_scratch_bytes)"))
      << unary;
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  const grpc::Status stream = StreamWithHeader(*stub, slicer->MakeHeader(), 1);
  EXPECT_EQ(stream.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << stream.error_message();
  EXPECT_TRUE(absl::StartsWith(stream.error_message(),
                               "indexer_scores: a row of 2097152 slots"))
      << stream.error_message();
  // A row of a quarter of the slots fits.
  wide.S /= 4;
  absl::StatusOr<v1::ComputeLossResponse> fits =
      client->ComputeLossUnary(MakeRequest(wide));
  EXPECT_TRUE(fits.ok()) << Describe(fits.status());
}

// What a tile would take in each compute thread is weighed before anything
// is computed, against --max_thread_scratch_bytes, in the unary call and at
// the stream's header.
TEST(ProjectionsAmplificationTest, ATileOverTheThreadScratchLimitIsRefused) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_thread_scratch_bytes=67108864"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = MakeClient((*server)->target());
  std::unique_ptr<v1::IndexerKl::Stub> stub = MakeStub((*server)->target());
  absl::StatusOr<int64_t> before = (*server)->RssKiB();
  ASSERT_TRUE(before.ok());
  const v1::ComputeLossRequest dense =
      MakeProjectionsRequest(ManyKeys(4, int64_t{1} << 21));
  const absl::Status unary = client->ComputeLossUnary(dense).status();
  EXPECT_TRUE(HasCode(unary, absl::StatusCode::kResourceExhausted,
                      "index_key: a tile of 1 query rows (H = 1, D = 1, "
                      "H_I = 1, D_I = 1) against S = 2097152 keys needs "))
      << unary;
  EXPECT_TRUE(absl::StrContains(unary.message(),
                                "over the limit of 67108864 "
                                "(--max_thread_scratch_bytes)"))
      << unary;
  ProjectionsSpec selecting = ManyKeys(4, int64_t{1} << 21);
  selecting.options.set_topk(1024);
  const absl::Status sparse =
      client->ComputeLossUnary(MakeProjectionsRequest(selecting)).status();
  EXPECT_TRUE(
      HasCode(sparse, absl::StatusCode::kResourceExhausted, "topk: a tile of "))
      << sparse;
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(dense);
  ASSERT_TRUE(slicer.ok()) << slicer.status();
  const grpc::Status stream = StreamWithHeader(*stub, slicer->MakeHeader(), 4);
  EXPECT_EQ(stream.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << stream.error_message();
  EXPECT_TRUE(absl::StartsWith(stream.error_message(), "index_key: a tile of"))
      << stream.error_message();
  // Fewer keys go through on the same server.
  absl::StatusOr<v1::ComputeLossResponse> small =
      client->ComputeLossUnary(MakeProjectionsRequest(ManyKeys(4, 4096)));
  EXPECT_TRUE(small.ok()) << Describe(small.status());
  const int64_t growth = RssGrowthKiB(**server, *before);
  EXPECT_LT(growth, 128 * 1024 + kQuarantineKiB)
      << "RSS grew by " << growth << " KiB";
}

// ---------------------------------------------------------------------------
// Items 6, 12, 13, 15, 16: requests that were answered wrongly or badly.

// The status of a stream that sends only the header of `spec`'s request.
grpc::Status HeaderStatus(v1::IndexerKl::Stub& stub, const ProblemSpec& spec) {
  const v1::ComputeLossRequest request = MakeRequest(spec);  // the slicer's
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  EXPECT_TRUE(slicer.ok()) << Describe(slicer.status());
  if (!slicer.ok()) return grpc::Status::CANCELLED;
  return RunStream(stub, {HeaderMessage(*slicer)}).status;
}

// The status of a stream of `spec`'s request that sends its rows one per
// block, each twice (counting first) when the problem counts first.
grpc::Status StreamRowByRow(v1::IndexerKl::Stub& stub,
                            const ProblemSpec& spec) {
  const v1::ComputeLossRequest request = MakeRequest(spec);  // the slicer's
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  EXPECT_TRUE(slicer.ok()) << Describe(slicer.status());
  if (!slicer.ok()) return grpc::Status::CANCELLED;
  std::vector<v1::ComputeLossStreamRequest> messages = {HeaderMessage(*slicer)};
  for (const bool counting : {true, false}) {
    if (counting && !slicer->counts_first()) continue;
    for (int64_t row = 0; row < slicer->num_rows(); ++row) {
      messages.push_back(BlockMessage(*slicer, row, 1, counting));
    }
  }
  return RunStream(stub, messages).status;
}

// HeaderStatus on a server of its own, started with --max_message_bytes.
grpc::Status HeaderStatusUnder(int64_t max_message_bytes,
                               const ProblemSpec& spec) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--max_message_bytes=" + std::to_string(max_message_bytes)});
  EXPECT_TRUE(server.ok()) << Describe(server.status());
  if (!server.ok()) return grpc::Status::CANCELLED;
  return HeaderStatus(*MakeStub((*server)->target()), spec);
}

class BadInputTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer({"--max_tensor_bytes=4096"}));
    metrics_port_ = server().metrics_port();
    channel_ = ChannelTo(server().target());
    stub_ = MakeStub(server().target());
  }
  int metrics_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::IndexerKl::Stub> stub_;
};

TEST_F(BadInputTest, BlockTargetInAFieldTheHeaderDidNotName) {
  // Head-aggregated: the header names attention_weights.
  const v1::ComputeLossRequest request = Small(4, 6);
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  v1::ComputeLossStreamRequest moved = BlockMessage(*slicer, 0, 4);
  moved.mutable_block()->mutable_attention_logits()->swap(
      *moved.mutable_block()->mutable_attention_weights());
  v1::ComputeLossStreamRequest both = BlockMessage(*slicer, 0, 4);
  *both.mutable_block()->mutable_attention_logits() =
      both.block().attention_weights();
  for (const auto& block : {moved, both}) {
    const StreamOutcome outcome =
        RunStream(*stub_, {HeaderMessage(*slicer), block});
    EXPECT_TRUE(HasCode(outcome.status, grpc::StatusCode::INVALID_ARGUMENT,
                        "attention_logits: the StreamHeader has no"));
  }
  // Per-head: the header names attention_logits.
  ProblemSpec s;
  s.name = "per-head";
  s.B = 1, s.T = 2, s.S = 4, s.H = 2;
  const v1::ComputeLossRequest per_head =
      MakeRequest(s);  // the slicer views it
  absl::StatusOr<RequestSlicer> heads = RequestSlicer::Create(per_head);
  ASSERT_TRUE(heads.ok());
  v1::ComputeLossStreamRequest extra = BlockMessage(*heads, 0, 2);
  extra.mutable_block()->set_attention_weights(std::string(32, '\0'));
  EXPECT_TRUE(HasCode(RunStream(*stub_, {HeaderMessage(*heads), extra}).status,
                      grpc::StatusCode::INVALID_ARGUMENT,
                      "attention_weights: the StreamHeader has no"));
}

TEST_F(BadInputTest, HugeValuesAreQuotedShortly) {
  v1::ComputeLossRequest dtype = Small();
  dtype.mutable_indexer_scores()->set_dtype(std::string(100000, 'F'));
  const absl::Status bad_dtype = client().ComputeLossUnary(dtype).status();
  EXPECT_TRUE(HasCode(bad_dtype, absl::StatusCode::kInvalidArgument,
                      "indexer_scores.dtype"));
  EXPECT_LT(bad_dtype.message().size(), 4096u);

  v1::ComputeLossRequest shape = Small();
  for (int i = 0; i < 1000000; ++i) {
    shape.mutable_indexer_scores()->add_shape(1);
  }
  const absl::Status bad_shape = client().ComputeLossUnary(shape).status();
  EXPECT_TRUE(
      HasCode(bad_shape, absl::StatusCode::kInvalidArgument, "indexer_scores"));
  EXPECT_LT(bad_shape.message().size(), 4096u);

  const absl::Status run =
      client().FinishStep(std::string(1 << 20, 'r'), 1).status();
  EXPECT_TRUE(run.code() == absl::StatusCode::kNotFound ||
              run.code() == absl::StatusCode::kInvalidArgument)
      << Describe(run);
  EXPECT_LT(run.message().size(), 4096u);
}

TEST_F(BadInputTest, UnparsableBytesAreInvalidArgumentAndCounted) {
  const std::string garbage("\xff\xff\xff\xff\x0f", 5);
  EXPECT_TRUE(HasCode(RawUnary(*channel_, kComputeLoss, garbage),
                      grpc::StatusCode::INVALID_ARGUMENT, "not a parsable"));
  const std::string scrape = ScrapeMetrics(metrics_port_);
  EXPECT_EQ(SeriesValue(scrape,
                        "klserve_requests_total{code=\"INVALID_ARGUMENT\","
                        "method=\"ComputeLoss\"}"),
            1)
      << scrape;

  const v1::ComputeLossRequest request = Small();
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  const std::string header = HeaderMessage(*slicer).SerializeAsString();
  // After every block: must not end OK as if the client had closed.
  const RawStreamOutcome after_all = RawBidi(
      *channel_, kComputeLossStream,
      {header, BlockMessage(*slicer, 0, 3).SerializeAsString(), garbage});
  EXPECT_TRUE(HasCode(after_all.status, grpc::StatusCode::INVALID_ARGUMENT,
                      "message 3"));
  // Mid-stream: the error says what happened, not "rows missing".
  const RawStreamOutcome mid =
      RawBidi(*channel_, kComputeLossStream,
              {header, BlockMessage(*slicer, 0, 1).SerializeAsString(), garbage,
               BlockMessage(*slicer, 1, 2).SerializeAsString()});
  EXPECT_TRUE(HasCode(mid.status, grpc::StatusCode::INVALID_ARGUMENT,
                      "not a parsable"));
}

TEST_F(BadInputTest, HeaderTensorsCountAgainstTheTensorLimit) {
  ProblemSpec s;
  s.name = "long";
  s.B = 1, s.T = 8192, s.S = 2, s.H = 0;
  s.row_valid = true;
  s.options.set_reduction(v1::REDUCTION_MEAN_VALID);
  const v1::ComputeLossRequest request = MakeRequest(s);  // the slicer views it
  absl::StatusOr<RequestSlicer> slicer = RequestSlicer::Create(request);
  ASSERT_TRUE(slicer.ok());
  // row_valid: 8192 bytes whole in the header, over --max_tensor_bytes=4096.
  EXPECT_TRUE(HasCode(RunStream(*stub_, {HeaderMessage(*slicer)}).status,
                      grpc::StatusCode::RESOURCE_EXHAUSTED, "row_valid"));
}

// A block carries whole rows: a stream whose single row could never pass
// the tensor or message limit is refused at its header, naming the tensor,
// where its first block used to be. A row that fits still streams.
TEST_F(BadInputTest, AStreamWhoseRowCouldNeverBeSentIsRefusedAtItsHeader) {
  ProblemSpec s;
  s.name = "wide";
  s.B = 1, s.T = 2;
  // Per-head logits: one row is 4 heads x 300 keys x 4 bytes = 4800.
  s.S = 300, s.H = 4;
  EXPECT_TRUE(HasCode(HeaderStatus(*stub_, s),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "attention_logits (one row): 4800 bytes"));
  // Head-aggregated weights: 1100 x 4 = 4400.
  s.S = 1100, s.H = 0;
  EXPECT_TRUE(HasCode(HeaderStatus(*stub_, s),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "attention_weights (one row): 4400 bytes"));
  // bfloat16 inputs of 3000 bytes a row, a float32 gradient of 6000.
  s.S = 1500, s.target_dtype = s.scores_dtype = "BF16";
  s.options.set_grad_dtype("FP32");
  EXPECT_TRUE(HasCode(HeaderStatus(*stub_, s),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "grad: 6000 bytes"));
  // With a bfloat16 gradient every row fits, and the stream computes.
  s.options.set_grad_dtype("BF16");
  const grpc::Status streamed = StreamRowByRow(*stub_, s);
  EXPECT_TRUE(streamed.ok()) << Describe(streamed);
}

// Each tensor of a row within the tensor limit, but not the row's block
// within the message limit, counted as gRPC counts it: the encoding of the
// tensors (4000 + 4000 bytes) with their framing.
TEST(OneRowMessageTest, ARowWhoseBlockCannotFitAMessageIsRefusedAtTheHeader) {
  ProblemSpec s;
  s.name = "row-message";
  s.B = 1, s.T = 2, s.S = 1000, s.H = 0;
  s.options.set_skip_grad(true);
  // The block: row_begin (up to 1: 2 bytes), num_rows (2), the two tensors
  // (1 + 2 + 4000 each), the message's own tag and length (1 + 2).
  constexpr int64_t kBlockMessage = 2 + 2 + 2 * (1 + 2 + 4000) + 1 + 2;
  EXPECT_TRUE(HasCode(HeaderStatusUnder(kBlockMessage - 1, s),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "attention_weights: a block of one row encodes to 8013 "
                      "bytes"));
  // At the limit exactly the rows stream one by one.
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {"--max_message_bytes=" + std::to_string(kBlockMessage)});
  ASSERT_TRUE(server.ok()) << Describe(server.status());
  const grpc::Status streamed =
      StreamRowByRow(*MakeStub((*server)->target()), s);
  EXPECT_TRUE(streamed.ok()) << Describe(streamed);
}

// The one-row answer is weighed as it is sent, framing included: a
// float32 gradient of 16-bit inputs is wider than the block it answers.
// And a stream that counts first sends each row twice, once with
// counting = true, whose block is two bytes longer (found by an attacking
// helper: both were accepted at the header and then failed every block).
TEST(OneRowMessageTest, TheAnswerAndTheCountingBlockAreWeighedToo) {
  ProblemSpec s;
  s.name = "wide-answer";
  s.B = 1, s.T = 2, s.S = 1019, s.H = 0;
  s.target_dtype = s.scores_dtype = "BF16";
  s.options.set_grad_dtype("FP32");
  // The block is 4089 bytes; the answer's gradient alone 4076.
  EXPECT_TRUE(HasCode(HeaderStatusUnder(4096, s),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "grad: the response would encode to"));
  s.name = "counting";
  s.S = 510, s.target_dtype = s.scores_dtype = "FP32";
  s.options.set_skip_grad(true);
  s.options.set_reduction(v1::REDUCTION_MEAN_VALID);
  // 2 x 2040 bytes of tensors, 13 of framing, 2 of counting = true.
  EXPECT_TRUE(HasCode(HeaderStatusUnder(4094, s),
                      grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "attention_weights: a block of one row encodes to 4095"));
  // At 4095 bytes the rows stream one by one, counting pass first.
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({"--max_message_bytes=4095"});
  ASSERT_TRUE(server.ok()) << Describe(server.status());
  const v1::ComputeLossRequest request = MakeRequest(s);
  ASSERT_TRUE(RequestSlicer::Create(request)->counts_first());
  const grpc::Status streamed =
      StreamRowByRow(*MakeStub((*server)->target()), s);
  EXPECT_TRUE(streamed.ok()) << Describe(streamed);
}

// c / N * grad_scale bounds every gradient entry: past the gradient dtype's
// range it is refused naming grad_scale, with N in the message, even where N
// is known only once the rows are counted (MEAN_VALID without row_valid,
// unary and streamed); up to it the gradient is finite. c alone may be any
// float32: the loss is a double.
TEST_F(BadInputTest, AGradientFactorPastItsDtypeIsRefused) {
  v1::ComputeLossRequest request = Small();  // MEAN: N = B * T = 3
  v1::LossOptions& options = *request.mutable_options();
  options.set_scaling_factor(1e308);
  EXPECT_TRUE(HasCode(client().ComputeLossUnary(request).status(),
                      absl::StatusCode::kInvalidArgument, "scaling_factor:"));

  options.set_grad_dtype("FP16");
  for (const v1::Reduction reduction :
       {v1::REDUCTION_MEAN, v1::REDUCTION_MEAN_VALID}) {
    SCOPED_TRACE(v1::Reduction_Name(reduction));
    options.set_reduction(reduction);  // N = 3 rows with keys either way
    options.set_scaling_factor(3 * 65504.0 + 1);
    EXPECT_TRUE(HasCode(client().ComputeLossUnary(request).status(),
                        absl::StatusCode::kInvalidArgument,
                        "grad_scale: |scaling_factor / N * grad_scale| must "
                        "be at most 65504"));
    EXPECT_TRUE(HasCode(client().ComputeLossStreaming(request, 1).status(),
                        absl::StatusCode::kInvalidArgument,
                        "got 196513 / 3 * 1 = 65504.333333333"));
    options.set_scaling_factor(3 * 65504.0);
    absl::StatusOr<v1::ComputeLossResponse> largest =
        client().ComputeLossUnary(request);
    ASSERT_TRUE(largest.ok()) << Describe(largest.status());
    for (int64_t i = 0; i < 15; ++i) {
      EXPECT_TRUE(std::isfinite(GetFloat(largest->grad(), i))) << i;
    }
    EXPECT_EQ(largest->result().loss(),
              3 * 65504.0 * largest->result().unscaled_loss());
  }

  // Without a gradient, c only scales the loss.
  options.set_skip_grad(true);
  options.set_scaling_factor(1e30);
  absl::StatusOr<v1::ComputeLossResponse> loss_only =
      client().ComputeLossUnary(request);
  ASSERT_TRUE(loss_only.ok()) << Describe(loss_only.status());
  EXPECT_EQ(loss_only->result().loss(),
            1e30 * loss_only->result().unscaled_loss());
}

}  // namespace
}  // namespace klserve::integration
