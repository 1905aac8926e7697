#include "server/metrics/label_sanitizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace klserve::server {
namespace {

// The bytes kept as they are.
bool IsPrintableAscii(unsigned char c) { return c >= 0x20 && c <= 0x7E; }

// The number of bytes of the UTF-8 sequence led by `c` (1 for a byte that
// leads none, so that invalid UTF-8 is replaced byte by byte).
size_t Utf8SequenceLength(unsigned char c) {
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

bool IsContinuationByte(unsigned char c) { return (c & 0xC0) == 0x80; }

// FNV-1a, 32 bits: stable across builds and platforms, unlike absl::Hash,
// so the same run keeps the same series after a restart.
uint32_t Fnv1a32(absl::string_view bytes) {
  uint32_t h = 2166136261u;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

}  // namespace

std::string SanitizeLabelValue(absl::string_view value, size_t max_length) {
  max_length = std::max<size_t>(max_length, 16);
  if (value.empty()) return "_";
  std::string out;
  out.reserve(std::min(value.size(), max_length + 1));
  // Past max_length the rest only feeds the hash below.
  for (size_t i = 0; i < value.size() && out.size() <= max_length;) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (IsPrintableAscii(c)) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // A well-formed multi-byte character becomes one '_'; any other
    // non-printable byte becomes one '_' on its own.
    size_t len = Utf8SequenceLength(c);
    if (len > 1) {
      if (i + len > value.size()) {
        len = 1;
      } else {
        for (size_t k = 1; k < len; ++k) {
          if (!IsContinuationByte(static_cast<unsigned char>(value[i + k]))) {
            len = 1;
            break;
          }
        }
      }
    }
    out.push_back('_');
    i += len;
  }
  if (out.size() > max_length) {
    constexpr size_t kSuffixLength = 9;  // '~' and 8 hex digits
    out.resize(max_length - kSuffixLength);
    absl::StrAppend(&out, absl::StrFormat("~%08x", Fnv1a32(value)));
  }
  return out;
}

std::string LayerLabelValue(std::optional<int32_t> layer) {
  if (!layer.has_value()) return std::string(kNoLayerLabel);
  return absl::StrCat(*layer);
}

}  // namespace klserve::server
