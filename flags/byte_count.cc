#include "flags/byte_count.h"

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace klserve::flags {
namespace {

// Largest first: a count prints in the first unit that divides it.
constexpr std::array<std::pair<absl::string_view, int64_t>, 4> kUnits = {{
    {"TiB", int64_t{1} << 40},
    {"GiB", int64_t{1} << 30},
    {"MiB", int64_t{1} << 20},
    {"KiB", int64_t{1} << 10},
}};

}  // namespace

bool AbslParseFlag(absl::string_view text, ByteCount* count,
                   std::string* error) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < trimmed.size() && absl::ascii_isdigit(trimmed[digits])) {
    ++digits;
  }
  const absl::string_view number = trimmed.substr(0, digits);
  const absl::string_view unit =
      absl::StripLeadingAsciiWhitespace(trimmed.substr(digits));
  int64_t multiplier = 0;
  // Case matters: "Mib" and "b" would be bits.
  if (unit.empty() || unit == "B") multiplier = 1;
  for (const auto& [name, bytes] : kUnits) {
    if (unit == name) multiplier = bytes;
  }
  if (number.empty() || multiplier == 0) {
    *error =
        "must be a count of bytes, a number alone or with KiB, MiB, GiB or "
        "TiB (powers of 1024), e.g. 268435456 or 256MiB";
    return false;
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(number, &value) ||
      value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() /
                                    multiplier)) {
    *error = absl::StrCat("must be at most ",
                          std::numeric_limits<int64_t>::max(), " bytes");
    return false;
  }
  count->bytes = static_cast<int64_t>(value) * multiplier;
  return true;
}

std::string AbslUnparseFlag(ByteCount count) {
  for (const auto& [name, bytes] : kUnits) {
    if (count.bytes > 0 && count.bytes % bytes == 0) {
      return absl::StrCat(count.bytes / bytes, name);
    }
  }
  return absl::StrCat(count.bytes);
}

}  // namespace klserve::flags
