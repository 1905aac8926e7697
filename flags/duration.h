#ifndef KLSERVE_FLAGS_DURATION_H_
#define KLSERVE_FLAGS_DURATION_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace klserve::flags {

// The value of a flag that is a length of time, written as absl::Duration
// reads it ("30s", "1.5m", "1h30m", "inf"). It differs from an
// absl::Duration flag in what it says about a refused value: a number
// without a unit ("--drain_timeout=30") is told which unit to add, where
// Abseil prints only "Illegal value".
struct Duration {
  absl::Duration value;
};

// Abseil's flag hooks.
bool AbslParseFlag(absl::string_view text, Duration* duration,
                   std::string* error);
std::string AbslUnparseFlag(Duration duration);

}  // namespace klserve::flags

#endif  // KLSERVE_FLAGS_DURATION_H_
