#include "kernels/cpu/usable_memory.h"

#include <unistd.h>

#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "kernels/cpu/cgroup_files.h"

namespace klserve::cpu {

std::optional<int64_t> BytesOfMemoryLimit(absl::string_view text) {
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &bytes) ||
      bytes <= 0) {
    return std::nullopt;  // "max", or not a limit at all
  }
  return bytes;
}

std::optional<int64_t> UsableMemoryBytes() {
  std::optional<int64_t> least;
  const auto take = [&](std::optional<int64_t> bytes) {
    if (bytes && (!least || *bytes < *least)) least = bytes;
  };
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_bytes > 0 &&
      pages <= std::numeric_limits<int64_t>::max() / page_bytes) {
    take(pages * page_bytes);
  }
  const auto take_file = [&](const std::string& path) {
    if (const std::optional<std::string> text = ReadCgroupFile(path)) {
      take(BytesOfMemoryLimit(*text));
    }
  };
  ForEachCgroupDir(
      "", [&](const std::string& dir) { take_file(dir + "/memory.max"); });
  ForEachCgroupDir("memory", [&](const std::string& dir) {
    take_file(dir + "/memory.limit_in_bytes");
  });
  return least;
}

}  // namespace klserve::cpu
