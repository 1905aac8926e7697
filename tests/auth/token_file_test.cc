// The bearer-token file's rules (auth/token_file.h), which the server and
// klctl share; each test writes the file's exact bytes.

#include "auth/token_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace klserve {
namespace {

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "klserve_auth_" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  return path;
}

// INVALID_ARGUMENT naming the flag and the file, with `words` in it.
void ExpectRefused(const std::string& path, const std::string& words) {
  const absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_FALSE(token.ok()) << "accepted \"" << *token << "\"";
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(token.status().message(), "--auth_token_file: "))
      << token.status();
  EXPECT_TRUE(absl::StrContains(token.status().message(), path))
      << token.status();
  EXPECT_TRUE(absl::StrContains(token.status().message(), words))
      << token.status();
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
  ExpectRefused(WriteTemp("empty", ""), "empty");
  ExpectRefused(WriteTemp("newlines", "\n\n"), "holds no token");
  EXPECT_FALSE(ReadTokenFile(::testing::TempDir() + "no/such/file").ok());
  EXPECT_FALSE(ReadTokenFile(WriteTemp("bin", "ab\x01 c")).ok());
  EXPECT_FALSE(ReadTokenFile(WriteTemp("mid", "ab\ncd")).ok());
}

TEST(ReadTokenFileTest, MessagesNameTheFlagAndTheFile) {
  ExpectRefused(::testing::TempDir() + "no/such/file", "cannot read");
  ExpectRefused(WriteTemp("only_cr", "\r"), "holds no token");
}

TEST(ReadTokenFileTest, OnlyTrailingLineEndsAreStripped) {
  // A leading newline, or one inside the token, is a byte of the token.
  ExpectRefused(WriteTemp("lead_nl", "\nabc"), "printable ASCII");
  ExpectRefused(WriteTemp("inner_cr", "ab\rc\n"), "printable ASCII");
  const absl::StatusOr<std::string> token =
      ReadTokenFile(WriteTemp("crlf_runs", "abc\n\r\n\r"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc");
}

TEST(ReadTokenFileTest, RejectsTabsAndOuterSpaces) {
  ExpectRefused(WriteTemp("tab", "ab\tc"), "printable ASCII");
  ExpectRefused(WriteTemp("trailing_tab", "abc\t\n"), "printable ASCII");
  ExpectRefused(WriteTemp("lead_space", " abc"), "start or end with a space");
  ExpectRefused(WriteTemp("trail_space", "abc \n"),
                "start or end with a space");
  ExpectRefused(WriteTemp("space", " \n"), "start or end with a space");
  // A space inside the token is printable ASCII, kept as it is.
  const absl::StatusOr<std::string> token =
      ReadTokenFile(WriteTemp("inner_space", "a b\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "a b");
}

TEST(ReadTokenFileTest, RejectsNonAsciiBytes) {
  ExpectRefused(WriteTemp("utf8", "caf\xc3\xa9"), "printable ASCII");
  ExpectRefused(WriteTemp("del", "abc\x7f"), "printable ASCII");
  ExpectRefused(WriteTemp("nul", std::string("a\0b", 3)), "printable ASCII");
}

TEST(ReadTokenFileTest, TokenLengthIsBoundedAfterStripping) {
  const std::string longest(4096, 'x');
  const absl::StatusOr<std::string> token =
      ReadTokenFile(WriteTemp("longest", longest + "\r\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, longest);
  ExpectRefused(WriteTemp("too_long", longest + "y\n"),
                "must be at most 4096 bytes");
  ExpectRefused(WriteTemp("too_long", longest + "y\n"), "got 4097");
}

}  // namespace
}  // namespace klserve
