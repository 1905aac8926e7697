#ifndef KLSERVE_PROTO_UTF8_H_
#define KLSERVE_PROTO_UTF8_H_

#include "absl/strings/string_view.h"

namespace klserve {

// Whether `text` is well-formed UTF-8: no overlong form, UTF-16 surrogate
// or code point past U+10FFFF. Protobuf requires it of a string field, and
// its parsers refuse the whole message otherwise (a TensorBoard event with
// the tag, a request with the run name), so writers check first.
bool IsUtf8(absl::string_view text);

}  // namespace klserve

#endif  // KLSERVE_PROTO_UTF8_H_
