#ifndef KLSERVE_FLAGS_BYTE_COUNT_H_
#define KLSERVE_FLAGS_BYTE_COUNT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace klserve::flags {

// The value of a flag that counts bytes: a plain number ("268435456") or one
// with a binary unit ("256MiB", "16GiB", "16 GiB"; KiB, MiB, GiB and TiB,
// powers of 1024). --help prints a default in the largest unit that divides it,
// which an operator reads more easily than 17179869184.
struct ByteCount {
  int64_t bytes = 0;
};

// Abseil's flag hooks. Decimal units (KB, MB, GB) are refused rather
// than guessed at: 1 GB and 1 GiB differ by 7%.
bool AbslParseFlag(absl::string_view text, ByteCount* count,
                   std::string* error);
std::string AbslUnparseFlag(ByteCount count);

}  // namespace klserve::flags

#endif  // KLSERVE_FLAGS_BYTE_COUNT_H_
