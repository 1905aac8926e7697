#include "flags/duration.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace klserve::flags {

bool AbslParseFlag(absl::string_view text, Duration* duration,
                   std::string* error) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  absl::Duration parsed;
  if (absl::ParseDuration(trimmed, &parsed)) {
    duration->value = parsed;
    return true;
  }
  constexpr absl::string_view kForm =
      "a number with a unit (ns, us, ms, s, m or h; e.g. 30s, 1.5m or 1h30m), "
      "or inf";
  double number = 0;
  if (absl::SimpleAtod(trimmed, &number)) {
    // Seconds are the likeliest meaning, but a guess would turn a
    // millisecond timeout into hours without a word.
    *error = absl::StrCat("needs a unit: ", trimmed, "s for seconds, ", trimmed,
                          "ms for milliseconds; must be ", kForm);
  } else {
    *error = absl::StrCat("must be ", kForm);
  }
  return false;
}

std::string AbslUnparseFlag(Duration duration) {
  return absl::FormatDuration(duration.value);
}

}  // namespace klserve::flags
