#include "server/tensorboard/run_name.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace klserve::server {
namespace {

bool IsRunNameCharacter(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == '-' || c == '+' || c == '=' || c == ',' || c == '/';
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", what, " (a run name is 1 to ", kMaxRunNameBytes,
                   " bytes of ", kRunNameCharacters, ")"));
}

}  // namespace

absl::Status CheckRunName(absl::string_view run, absl::string_view field) {
  if (run.empty()) return Invalid(field, "must not be empty");
  if (run.size() > kMaxRunNameBytes) {
    return Invalid(field, absl::StrCat("is ", run.size(), " bytes long"));
  }
  for (size_t i = 0; i < run.size(); ++i) {
    if (!IsRunNameCharacter(run[i])) {
      // The byte is shown as a number: it may be unprintable.
      return Invalid(field,
                     absl::StrCat("byte ", i, " (0x",
                                  absl::Hex(static_cast<unsigned char>(run[i]),
                                            absl::kZeroPad2),
                                  ") is not allowed"));
    }
  }
  for (absl::string_view part : absl::StrSplit(run, '/')) {
    if (part.empty()) {
      return Invalid(field,
                     "has an empty part (a leading, trailing or doubled /)");
    }
    if (part == "." || part == "..") {
      return Invalid(field, absl::StrCat("has a \"", part, "\" part"));
    }
    // TensorBoard takes any file or directory whose name holds "tfevents"
    // for an event file of the run it lies in: a run "a/x.tfevents" would
    // break run "a" for its Python loader.
    if (absl::StrContains(part, "tfevents")) {
      return Invalid(field,
                     absl::StrCat("has a part \"", part,
                                  "\" holding \"tfevents\", which TensorBoard "
                                  "would read as an event file"));
    }
  }
  return absl::OkStatus();
}

}  // namespace klserve::server
