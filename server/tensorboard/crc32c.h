#ifndef KLSERVE_SERVER_TENSORBOARD_CRC32C_H_
#define KLSERVE_SERVER_TENSORBOARD_CRC32C_H_

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// TFRecord framing. Debian's Abseil has no absl/crc, so it lives here. All
// functions are pure and safe to call from any thread.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace klserve::server {

// Extends `crc`, the CRC-32C of some prefix (0 for the empty one), by
// `data`. Crc32cExtend(Crc32cExtend(0, a), b) == Crc32c(a + b). Uses the
// SSE4.2 crc32 instruction when the build targets it (__SSE4_2__), else the
// portable table code; both give identical results.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(absl::string_view data) {
  return Crc32cExtend(0, data.data(), data.size());
}

// TFRecord stores a rotated-and-offset CRC so that a CRC computed over bytes
// that themselves contain CRCs does not degenerate.
inline uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

inline uint32_t MaskedCrc32c(absl::string_view data) {
  return MaskCrc32c(Crc32c(data));
}

namespace crc32c_internal {

// The two implementations behind Crc32cExtend, exposed so tests can check
// that they agree. Same contract as Crc32cExtend.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size);

// True when ExtendSse42 exists, i.e. the build targets SSE4.2.
#if defined(__SSE4_2__)
inline constexpr bool kHaveSse42 = true;
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t size);
#else
inline constexpr bool kHaveSse42 = false;
#endif

}  // namespace crc32c_internal

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_TENSORBOARD_CRC32C_H_
