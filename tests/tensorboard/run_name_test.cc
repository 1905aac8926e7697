// Run names name Prometheus series and TensorBoard directories as they are,
// so the check is what keeps distinct runs apart: everything it accepts is
// its own label and its own relative path inside the log directory.

#include "server/tensorboard/run_name.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace klserve::server {
namespace {

TEST(CheckRunName, AcceptsUsualNames) {
  for (const std::string& run :
       {std::string("exp1"), std::string("exp-1.lr3e-4/seed_2"),
        std::string("deepseek-v3.2/warmup/run_7"), std::string("lr=3e-4,bs+64"),
        std::string("..."), std::string(".hidden/a..b"),
        std::string(kMaxRunNameBytes, 'r')}) {
    EXPECT_TRUE(CheckRunName(run, "tags.run").ok()) << run;
  }
}

TEST(CheckRunName, RefusesWhatWouldBeRewrittenOrEscape) {
  struct Case {
    std::string run;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "must not be empty"},
      {std::string(kMaxRunNameBytes + 1, 'r'), "is 129 bytes long"},
      {"job\x01", "byte 3 (0x01) is not allowed"},
      {"a b", "byte 1 (0x20) is not allowed"},
      {"caf\xc3\xa9", "byte 3 (0xc3) is not allowed"},
      {std::string("nul\0byte", 8), "byte 3 (0x00) is not allowed"},
      {"a\\b", "(0x5c)"},
      {"a\"b", "(0x22)"},
      {"/abs", "empty part"},
      {"a/", "empty part"},
      {"a//b", "empty part"},
      {".", "a \".\" part"},
      {"../x", "a \"..\" part"},
      {"a/../b", "a \"..\" part"},
      {"victim/events.out.tfevents.0", "part \"events.out.tfevents.0\""},
      {"x.tfevents", "TensorBoard would read as an event file"},
  };
  for (const Case& c : cases) {
    const absl::Status status = CheckRunName(c.run, "tags.run");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.run;
    EXPECT_TRUE(absl::StartsWith(status.message(), "tags.run: "))
        << status.message();
    EXPECT_TRUE(absl::StrContains(status.message(), c.says))
        << status.message();
    EXPECT_TRUE(absl::StrContains(status.message(), kRunNameCharacters))
        << status.message();
  }
}

TEST(CheckRunName, NamesTheField) {
  EXPECT_TRUE(absl::StartsWith(CheckRunName("", "run").message(), "run: "));
}

}  // namespace
}  // namespace klserve::server
