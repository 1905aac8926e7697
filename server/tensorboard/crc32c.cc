#include "server/tensorboard/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace klserve::server {
namespace crc32c_internal {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41, bit-reversed

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// Slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes,
// so eight input bytes fold into the CRC with eight independent lookups
// instead of eight dependent ones.
constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    }
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t prev = t[k - 1][b];
      t[k][b] = (prev >> 8) ^ t[0][prev & 0xffu];
    }
  }
  return t;
}

constexpr Tables kTables = MakeTables();

// Little-endian load regardless of the host's byte order; compilers turn
// this into one mov on x86.
inline uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
         (uint32_t{p[3]} << 24);
}

}  // namespace

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    const uint32_t lo = LoadLe32(p) ^ c;
    const uint32_t hi = LoadLe32(p + 4);
    c = kTables[7][lo & 0xffu] ^ kTables[6][(lo >> 8) & 0xffu] ^
        kTables[5][(lo >> 16) & 0xffu] ^ kTables[4][lo >> 24] ^
        kTables[3][hi & 0xffu] ^ kTables[2][(hi >> 8) & 0xffu] ^
        kTables[1][(hi >> 16) & 0xffu] ^ kTables[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xffu];
    ++p;
    --size;
  }
  return ~c;
}

#if defined(__SSE4_2__)
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  // Byte steps up to an 8-byte boundary keep the 64-bit loads aligned.
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(c, *p);
    ++p;
    --size;
  }
  // One dependent chain: ~8 bytes per 3 cycles, far more than event files
  // need, so no multi-stream interleaving.
  uint64_t c64 = c;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    c64 = _mm_crc32_u64(c64, word);
    p += 8;
    size -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (size > 0) {
    c = _mm_crc32_u8(c, *p);
    ++p;
    --size;
  }
  return ~c;
}
#endif

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__SSE4_2__)
  return crc32c_internal::ExtendSse42(crc, data, size);
#else
  return crc32c_internal::ExtendPortable(crc, data, size);
#endif
}

}  // namespace klserve::server
