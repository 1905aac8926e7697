// The constant-time comparison of server/service/auth.h (the token file's
// rules are in tests/auth, the RPC-level check in
// tests/integration/security_test.cc).

#include "server/service/auth.h"

#include <gtest/gtest.h>

#include <string>

namespace klserve::server {
namespace {

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

}  // namespace
}  // namespace klserve::server
