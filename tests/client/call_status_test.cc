#include "client/call_status.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace klserve {
namespace {

// StatusFromCall of a call whose server sent no trailing metadata.
absl::Status StatusFromCall(const grpc::Status& status) {
  grpc::ClientContext context;
  return klserve::StatusFromCall(status, context);
}

TEST(StatusFromCall, KeepsCodeAndMessage) {
  EXPECT_TRUE(StatusFromCall(grpc::Status::OK).ok());
  const absl::Status s = StatusFromCall(grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT, "indexer_scores: dtype must be ..."));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "indexer_scores: dtype must be ...");
  EXPECT_EQ(StatusFromCall(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x"))
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(StatusFromCall, ShutdownDropIsUnavailable) {
  // What gRPC reports for a call no handler took before the server stopped.
  const absl::Status s =
      StatusFromCall(grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("shut down"), absl::string_view::npos);
}

TEST(StatusFromCall, OtherCancelsStayCancelled) {
  // A server's own cancel carries its message.
  EXPECT_EQ(StatusFromCall(grpc::Status(grpc::StatusCode::CANCELLED,
                                        "ComputeLossStream: cancelled by the "
                                        "client or its deadline"))
                .code(),
            absl::StatusCode::kCancelled);
}

// A call the server's shutdown cut (its drain ran out) says so.
TEST(ExplainUnavailable, ACallCutByTheEndOfADrainSaysSo) {
  const absl::Status s = ExplainUnavailable(
      absl::UnavailableError("Cancelling all calls"), false, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(
      s.message(), "Cancelling all calls (the server stopped while this call"))
      << s;
  EXPECT_NE(s.message().find("--drain_timeout"), absl::string_view::npos) << s;
}

// The server killed under a stream: the call had started, so neither the
// address nor TLS was wrong.
TEST(ExplainUnavailable, AConnectionClosedUnderACallIsNotATlsQuestion) {
  const absl::Status s = ExplainUnavailable(
      absl::UnavailableError("Stream removed (Socket closed)"), false, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "Stream removed (Socket closed) (the connection "
                               "closed while this call was in flight"))
      << s;
  EXPECT_EQ(s.message().find("TLS"), absl::string_view::npos) << s;
}

// What gRPC reports when nothing listens (TCP, then a Unix socket), and
// when something does but the connection fails below the call.
TEST(ExplainUnavailable, NothingListeningIsNotATlsQuestion) {
  for (const char* message :
       {"failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection "
        "refused",
        "failed to connect to all addresses; last error: UNKNOWN: "
        "unix:/tmp/x.sock: No such file or directory"}) {
    const absl::Status s =
        ExplainUnavailable(absl::UnavailableError(message), false, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("nothing listens at this address"),
              absl::string_view::npos)
        << s;
    EXPECT_EQ(s.message().find("TLS"), absl::string_view::npos) << s;
  }
  const absl::Status closed =
      ExplainUnavailable(absl::UnavailableError("Socket closed"), false, false);
  EXPECT_NE(closed.message().find("tls_ca_file"), absl::string_view::npos)
      << closed;
  // A web server's answer (klserve's /metrics port, say), as gRPC 1.51
  // reports it: named first, with a TLS proxy as the other cause.
  const absl::Status web = ExplainUnavailable(
      absl::UnavailableError("failed to connect to all addresses; last error: "
                             "UNAVAILABLE: ipv4:127.0.0.1:9464: Failed "
                             "parsing HTTP/2"),
      false, false);
  EXPECT_NE(web.message().find("something other than a gRPC server answers"),
            absl::string_view::npos)
      << web;
  EXPECT_NE(web.message().find("/metrics port"), absl::string_view::npos)
      << web;
  const absl::Status other = absl::UnavailableError("draining");
  EXPECT_EQ(ExplainUnavailable(other, false, false), other);
}

TEST(ExplainMessageLimit, NamesWhoseLimitAMessageMet) {
  const auto whose = [](absl::string_view message, int64_t own_limit) {
    const absl::Status status =
        ExplainMessageLimit(absl::ResourceExhaustedError(message), own_limit);
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StartsWith(status.message(), message)) << status;
    return std::string(status.message().substr(message.size()));
  };
  // The server refused the request at its own limit.
  EXPECT_EQ(whose("Received message larger than max (4194362 vs. 1048576)",
                  int64_t{1} << 30),
            " (the server's --max_message_bytes is 1048576 bytes: klctl "
            "--stream=always, or a --stream_threshold below it, sends the "
            "tensors in blocks of --block_bytes, which must be well below it "
            "too, as a projections-form block's answer also carries the rows "
            "of a tile the block before left open "
            "(ClientOptions::stream_threshold_bytes, block_bytes))");
  // This client would not send it, or not take the answer.
  EXPECT_TRUE(absl::StartsWith(
      whose("CLIENT: Sent message larger than max (4194362 vs. 3145728)",
            3145728),
      " (this client's max_message_bytes is 3145728 bytes"));
  EXPECT_TRUE(absl::StartsWith(
      whose("Received message larger than max (9000 vs. 4096)", 4096),
      " (this client's max_message_bytes is 4096 bytes"));
  // Anything else stays as it is.
  for (const absl::Status& other :
       {absl::ResourceExhaustedError("server: 8 requests in flight"),
        absl::ResourceExhaustedError("message larger than max (x vs. y)"),
        absl::InvalidArgumentError(
            "Received message larger than max (9 vs. 4)")}) {
    EXPECT_EQ(ExplainMessageLimit(other, 4), other);
  }
}

}  // namespace
}  // namespace klserve
