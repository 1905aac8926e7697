// The token file reader and the constant-time comparison of server/service/auth.h
// (the RPC-level check is in tests/integration/security_test.cc).

#include "server/service/auth.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"

namespace klserve::server {
namespace {

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "klserve_auth_" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  return path;
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0c", 3), "a"));
}

TEST(ReadTokenFileTest, StripsTrailingNewlines) {
  absl::StatusOr<std::string> token =
      ReadTokenFile(WriteTemp("nl", "tok-en 1\r\n\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "tok-en 1");
  token = ReadTokenFile(WriteTemp("plain", "abc"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc");
}

TEST(ReadTokenFileTest, RejectsEmptyMissingAndBinary) {
  for (const std::string& content : {std::string(""), std::string("\n\n")}) {
    absl::StatusOr<std::string> token =
        ReadTokenFile(WriteTemp("empty", content));
    ASSERT_FALSE(token.ok());
    EXPECT_TRUE(absl::StrContains(token.status().message(), "holds no token"))
        << token.status();
  }
  EXPECT_FALSE(ReadTokenFile(::testing::TempDir() + "no/such/file").ok());
  EXPECT_FALSE(ReadTokenFile(WriteTemp("bin", "ab\x01 c")).ok());
  EXPECT_FALSE(ReadTokenFile(WriteTemp("mid", "ab\ncd")).ok());
}

}  // namespace
}  // namespace klserve::server
