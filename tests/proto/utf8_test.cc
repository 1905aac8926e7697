// The UTF-8 check protobuf makes of a string field (proto/utf8.h), against
// the table of well-formed byte sequences in Unicode's chapter 3.

#include "proto/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace klserve {
namespace {

TEST(IsUtf8, TakesEveryLengthOfSequenceAtItsBounds) {
  for (const std::string text :
       {"", "ascii \x7f", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80",
        "\xed\x9f\xbf", "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
        "\xf4\x8f\xbf\xbf", "r\xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82"}) {
    EXPECT_TRUE(IsUtf8(text)) << text;
  }
  EXPECT_TRUE(IsUtf8(std::string("nul \0 inside", 12)));
}

TEST(IsUtf8, RefusesWhatIsNotWellFormed) {
  for (const std::string text : {
           "\x80",                  // a continuation byte first
           "\xc0\xaf",              // overlong '/'
           "\xc1\xbf",              // overlong
           "\xe0\x9f\xbf",          // overlong three-byte form
           "\xed\xa0\x80",          // a surrogate (U+D800)
           "\xed\xbf\xbf",          // a surrogate (U+DFFF)
           "\xf0\x8f\xbf\xbf",      // overlong four-byte form
           "\xf4\x90\x80\x80",      // past U+10FFFF
           "\xf8\x88\x80\x80\x80",  // a five-byte form
           "\xff", "\xfe",
           "\xc3",      // cut short
           "\xe2\x82",  // cut short
           "a\xc3(",    // a lead byte without its continuation
       }) {
    EXPECT_FALSE(IsUtf8(text)) << testing::PrintToString(text);
  }
}

}  // namespace
}  // namespace klserve
