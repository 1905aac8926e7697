// Label values from clients: printable ASCII, bounded, never empty, and long
// names that differ only at the end stay distinct.

#include "server/metrics/label_sanitizer.h"

#include <string>

#include "gtest/gtest.h"

namespace klserve::server {
namespace {

TEST(SanitizeLabelValue, KeepsPrintableAscii) {
  EXPECT_EQ(SanitizeLabelValue("deepseek-v3.2/warmup run #7 {a=\"b\"}\\"),
            "deepseek-v3.2/warmup run #7 {a=\"b\"}\\");
}

TEST(SanitizeLabelValue, EmptyBecomesUnderscore) {
  EXPECT_EQ(SanitizeLabelValue(""), "_");
}

TEST(SanitizeLabelValue, ReplacesControlBytes) {
  EXPECT_EQ(SanitizeLabelValue(std::string("a\nb\tc\0d\x7f", 8)), "a_b_c_d_");
}

TEST(SanitizeLabelValue, ReplacesEachUtf8CharacterByOneUnderscore) {
  // "é" is 2 bytes, "€" 3, "😀" 4.
  EXPECT_EQ(SanitizeLabelValue("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80!"),
            "caf_ _ _!");
}

TEST(SanitizeLabelValue, ReplacesInvalidUtf8ByteByByte) {
  // A lead byte without its continuation, and stray continuation bytes.
  EXPECT_EQ(SanitizeLabelValue("a\xc3z\x80\x80"), "a_z__");
  // A truncated sequence at the end.
  EXPECT_EQ(SanitizeLabelValue("a\xe2\x82"), "a__");
}

TEST(SanitizeLabelValue, KeepsAValueOfExactlyTheLimit) {
  const std::string value(kMaxLabelValueLength, 'r');
  EXPECT_EQ(SanitizeLabelValue(value), value);
}

TEST(SanitizeLabelValue, CutsLongValuesWithAHashSuffix) {
  const std::string prefix(200, 'r');
  const std::string a = SanitizeLabelValue(prefix + "/seed1");
  const std::string b = SanitizeLabelValue(prefix + "/seed2");
  EXPECT_EQ(a.size(), kMaxLabelValueLength);
  EXPECT_EQ(b.size(), kMaxLabelValueLength);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.substr(0, kMaxLabelValueLength - 9),
            std::string(kMaxLabelValueLength - 9, 'r'));
  EXPECT_EQ(a[kMaxLabelValueLength - 9], '~');
  // Deterministic: the same run keeps its series across calls (and restarts).
  EXPECT_EQ(a, SanitizeLabelValue(prefix + "/seed1"));
}

TEST(SanitizeLabelValue, BoundsAHugeValue) {
  const std::string huge(1 << 20, '\xff');
  const std::string out = SanitizeLabelValue(huge);
  EXPECT_EQ(out.size(), kMaxLabelValueLength);
  for (char c : out) {
    EXPECT_TRUE(c >= 0x20 && c <= 0x7e) << static_cast<int>(c);
  }
}

TEST(SanitizeLabelValue, HonoursASmallerLimit) {
  EXPECT_EQ(SanitizeLabelValue(std::string(40, 'x'), 32).size(), 32u);
  EXPECT_EQ(SanitizeLabelValue(std::string(32, 'x'), 32), std::string(32, 'x'));
}

TEST(LayerLabelValue, NumbersAndTheUntaggedLayer) {
  EXPECT_EQ(LayerLabelValue(0), "0");
  EXPECT_EQ(LayerLabelValue(60), "60");
  EXPECT_EQ(LayerLabelValue(-1), "-1");
  EXPECT_EQ(LayerLabelValue(std::nullopt), kNoLayerLabel);
  EXPECT_NE(LayerLabelValue(std::nullopt), kAllLayersLabel);
}

}  // namespace
}  // namespace klserve::server
