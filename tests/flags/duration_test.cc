#include "flags/duration.h"

#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace klserve::flags {
namespace {

absl::Duration Parsed(const std::string& text) {
  Duration duration{absl::Seconds(-7)};
  std::string error;
  EXPECT_TRUE(AbslParseFlag(text, &duration, &error)) << text << ": " << error;
  return duration.value;
}

std::string Refusal(const std::string& text) {
  Duration duration{absl::Seconds(-7)};
  std::string error;
  EXPECT_FALSE(AbslParseFlag(text, &duration, &error)) << text;
  EXPECT_EQ(duration.value, absl::Seconds(-7)) << text;  // untouched
  return error;
}

TEST(Duration, ReadsWhatAbslDurationReads) {
  EXPECT_EQ(Parsed("30s"), absl::Seconds(30));
  EXPECT_EQ(Parsed("250ms"), absl::Milliseconds(250));
  EXPECT_EQ(Parsed("1.5m"), absl::Seconds(90));
  EXPECT_EQ(Parsed("1h30m"), absl::Minutes(90));
  EXPECT_EQ(Parsed(" 2s "), absl::Seconds(2));
  EXPECT_EQ(Parsed("0"), absl::ZeroDuration());
  EXPECT_EQ(Parsed("inf"), absl::InfiniteDuration());
  EXPECT_EQ(Parsed("-3s"), absl::Seconds(-3));  // the range is the user's
}

TEST(Duration, ANumberWithoutUnitIsToldWhichUnitToAdd) {
  EXPECT_EQ(Refusal("30"),
            "needs a unit: 30s for seconds, 30ms for milliseconds; must be a "
            "number with a unit (ns, us, ms, s, m or h; e.g. 30s, 1.5m or "
            "1h30m), or inf");
  EXPECT_NE(Refusal("0.5").find("0.5s for seconds"), std::string::npos);
}

TEST(Duration, WhatIsNoDurationIsRefusedWithTheForm) {
  for (const char* text : {"", "s", "30 seconds", "30sec", "1d", "forever"}) {
    EXPECT_EQ(Refusal(text),
              "must be a number with a unit (ns, us, ms, s, m or h; e.g. 30s, "
              "1.5m or 1h30m), or inf")
        << text;
  }
}

TEST(Duration, WhatItPrintsParsesBack) {
  for (const absl::Duration value :
       {absl::ZeroDuration(), absl::Milliseconds(100), absl::Seconds(30),
        absl::Minutes(5), absl::Hours(24) + absl::Milliseconds(1),
        absl::InfiniteDuration()}) {
    EXPECT_EQ(Parsed(AbslUnparseFlag(Duration{value})), value);
  }
  EXPECT_EQ(AbslUnparseFlag(Duration{absl::Minutes(5)}), "5m");
}

}  // namespace
}  // namespace klserve::flags
