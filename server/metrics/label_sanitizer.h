#ifndef KLSERVE_SERVER_METRICS_LABEL_SANITIZER_H_
#define KLSERVE_SERVER_METRICS_LABEL_SANITIZER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace klserve::server {

// Label values klserve puts on its Prometheus series come from clients (the
// run name of a request's tags), so they are made safe and short before they
// become series: a client cannot blow up the exposition or a dashboard with a
// megabyte-long or binary run name.

// The longest label value SanitizeLabelValue returns, in bytes.
inline constexpr size_t kMaxLabelValueLength = 128;

// The `layer` label of a step's mean over layers.
inline constexpr absl::string_view kAllLayersLabel = "all";
// The `layer` label of the samples that carry no layer tag (they form one
// implicit layer).
inline constexpr absl::string_view kNoLayerLabel = "none";

// `value` as a label value: printable ASCII (0x20..0x7E) is kept; every other
// byte is replaced by '_', a UTF-8 multi-byte character by a single '_'. An
// empty value becomes "_". A result longer than `max_length` (at least 16) is
// cut to `max_length` bytes whose last 9 are '~' and 8 hex digits of a hash
// of the whole original value, so that long names differing only at the end
// (".../seed1", ".../seed2") stay distinct series.
// Deterministic and thread-safe.
std::string SanitizeLabelValue(absl::string_view value,
                               size_t max_length = kMaxLabelValueLength);

// The `layer` label of a layer tag: its decimal value, or kNoLayerLabel when
// the samples carried none.
std::string LayerLabelValue(std::optional<int32_t> layer);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_METRICS_LABEL_SANITIZER_H_
