#include "client/call_status.h"

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

}  // namespace
}  // namespace klserve
