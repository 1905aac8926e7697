#include "client/call_status.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace klserve {
namespace {

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

}  // namespace
}  // namespace klserve
