#include "server/shm/region_names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace klserve::server {

absl::Status CheckPlainName(absl::string_view field, absl::string_view name,
                            int max_bytes) {
  if (name.empty() || static_cast<int>(name.size()) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be 1 to ", max_bytes, " bytes, got ", name.size()));
  }
  if (name.front() == '.') {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: must not start with '.', got \"%s\"", field,
                        absl::CHexEscape(name)));
  }
  for (const char c : name) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
        c == '_' || c == '-') {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: only A-Z a-z 0-9 . _ - (a plain name, no path), got \"%s\"", field,
        absl::CHexEscape(name)));
  }
  return absl::OkStatus();
}

}  // namespace klserve::server
