#include "flags/byte_count.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace klserve::flags {
namespace {

int64_t Parsed(const std::string& text) {
  ByteCount count{-1};
  std::string error;
  EXPECT_TRUE(AbslParseFlag(text, &count, &error)) << text << ": " << error;
  return count.bytes;
}

std::string Refusal(const std::string& text) {
  ByteCount count{-1};
  std::string error;
  EXPECT_FALSE(AbslParseFlag(text, &count, &error)) << text;
  EXPECT_EQ(count.bytes, -1) << text;  // untouched
  return error;
}

TEST(ByteCount, NumbersAloneAreBytes) {
  EXPECT_EQ(Parsed("0"), 0);
  EXPECT_EQ(Parsed("4095"), 4095);
  EXPECT_EQ(Parsed("268435456"), 268435456);
  EXPECT_EQ(Parsed("17B"), 17);
  EXPECT_EQ(Parsed(" 30000 "), 30000);
}

TEST(ByteCount, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(Parsed("512KiB"), 512 * 1024);
  EXPECT_EQ(Parsed("256MiB"), 256 * 1024 * 1024);
  EXPECT_EQ(Parsed("16GiB"), int64_t{16} * 1024 * 1024 * 1024);
  EXPECT_EQ(Parsed("16 GiB"), int64_t{16} * 1024 * 1024 * 1024);
  EXPECT_EQ(Parsed("2TiB"), int64_t{2} * 1024 * 1024 * 1024 * 1024);
}

TEST(ByteCount, WhatIsNotACountIsRefusedWithTheForm) {
  for (const char* text : {"", "MiB", "-1", "+5", "1.5GiB", "1GB", "1G", "1Gi",
                           "1gib", "1Mib", "1b", "1 MiB x", "0x100", "abc"}) {
    EXPECT_NE(Refusal(text).find("e.g. 268435456 or 256MiB"), std::string::npos)
        << text;
  }
}

TEST(ByteCount, OverflowIsRefusedNotWrapped) {
  // 2^63 - 1 is the largest; 8 EiB in TiB is 2^63, one past it.
  EXPECT_EQ(Parsed("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Parsed("8388607TiB"), int64_t{8388607} << 40);
  for (const char* text :
       {"9223372036854775808", "8388608TiB", "99999999999999999999999"}) {
    EXPECT_NE(Refusal(text).find("at most 9223372036854775807"),
              std::string::npos)
        << text;
  }
}

TEST(ByteCount, PrintsTheLargestUnitThatDividesIt) {
  EXPECT_EQ(AbslUnparseFlag(ByteCount{0}), "0");
  EXPECT_EQ(AbslUnparseFlag(ByteCount{30000}), "30000");
  EXPECT_EQ(AbslUnparseFlag(ByteCount{268435456}), "256MiB");
  EXPECT_EQ(AbslUnparseFlag(ByteCount{int64_t{17179869184}}), "16GiB");
  EXPECT_EQ(AbslUnparseFlag(ByteCount{1536}), "1536");  // 1.5 KiB
  EXPECT_EQ(AbslUnparseFlag(ByteCount{3 * 1024}), "3KiB");
  EXPECT_EQ(AbslUnparseFlag(ByteCount{int64_t{1} << 40}), "1TiB");
}

TEST(ByteCount, WhatItPrintsParsesBack) {
  for (int64_t bytes :
       {int64_t{0}, int64_t{1}, int64_t{1536}, int64_t{1} << 30,
        (int64_t{1} << 40) * 3 + 1024, std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(Parsed(AbslUnparseFlag(ByteCount{bytes})), bytes) << bytes;
  }
}

}  // namespace
}  // namespace klserve::flags
