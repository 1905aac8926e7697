// CRC-32C against published vectors, and the table and SSE4.2 paths against
// each other and against a bit-at-a-time reference written here.

#include "server/tensorboard/crc32c.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace klserve::server {
namespace {

// One bit per step, straight from the definition; shares nothing with the
// library's tables.
uint32_t BitwiseCrc32c(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1u) * 0x82F63B78u);
  }
  return ~c;
}

std::string Bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

struct Vector {
  const char* name;
  std::string data;
  uint32_t crc;
};

std::vector<Vector> PublishedVectors() {
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  // RFC 3720 B.4, the iSCSI SCSI Read (10) command PDU.
  const std::string read10_pdu = Bytes(
      {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
       0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
       0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
       0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  return {
      {"empty", "", 0x00000000u},
      {"a", "a", 0xC1D04330u},
      {"123456789", "123456789", 0xE3069283u},
      {"32 zeros (RFC 3720)", std::string(32, '\0'), 0x8A9136AAu},
      {"32 x 0xff (RFC 3720)", std::string(32, '\xff'), 0x62A8AB43u},
      {"0..31 (RFC 3720)", ascending, 0x46DD794Eu},
      {"31..0 (RFC 3720)", descending, 0x113FDB5Cu},
      {"Read(10) PDU (RFC 3720)", read10_pdu, 0xD9963A56u},
  };
}

TEST(Crc32c, MatchesPublishedVectors) {
  for (const Vector& v : PublishedVectors()) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(Crc32c(v.data), v.crc);
    EXPECT_EQ(crc32c_internal::ExtendPortable(0, v.data.data(), v.data.size()),
              v.crc);
    EXPECT_EQ(BitwiseCrc32c(reinterpret_cast<const uint8_t*>(v.data.data()),
                            v.data.size()),
              v.crc);
  }
}

#if defined(__SSE4_2__)
TEST(Crc32c, Sse42MatchesPublishedVectors) {
  for (const Vector& v : PublishedVectors()) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(crc32c_internal::ExtendSse42(0, v.data.data(), v.data.size()),
              v.crc);
  }
}
#endif

TEST(Crc32c, ExtendEqualsOneShot) {
  const std::string data = "The quick brown fox jumps over the lazy dog";
  for (size_t split = 0; split <= data.size(); ++split) {
    const uint32_t head = Crc32cExtend(0, data.data(), split);
    EXPECT_EQ(Crc32cExtend(head, data.data() + split, data.size() - split),
              Crc32c(data))
        << "split at " << split;
  }
}

// Every length 0..300 (so each tail and head case of the 8-byte loops), at
// every alignment 0..15, then a few long buffers; the paths and the bitwise
// reference must agree, also when extending a non-zero CRC.
TEST(Crc32c, PathsAgreeOnRandomBuffers) {
  std::mt19937 rng(20240601);
  std::vector<uint8_t> storage(70000 + 16);
  for (uint8_t& b : storage) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {1023u, 4096u, 4099u, 65536u, 70000u}) lengths.push_back(n);

  for (size_t n : lengths) {
    for (size_t offset = 0; offset < 16; ++offset) {
      const uint8_t* p = storage.data() + offset;
      const uint32_t seed = static_cast<uint32_t>(rng());
      const uint32_t expected = BitwiseCrc32c(p, n);
      ASSERT_EQ(crc32c_internal::ExtendPortable(0, p, n), expected)
          << "portable, length " << n << " offset " << offset;
      ASSERT_EQ(Crc32cExtend(0, p, n), expected)
          << "dispatch, length " << n << " offset " << offset;
      const uint32_t extended = crc32c_internal::ExtendPortable(seed, p, n);
      ASSERT_EQ(Crc32cExtend(seed, p, n), extended)
          << "seeded, length " << n << " offset " << offset;
#if defined(__SSE4_2__)
      ASSERT_EQ(crc32c_internal::ExtendSse42(0, p, n), expected)
          << "sse4.2, length " << n << " offset " << offset;
      ASSERT_EQ(crc32c_internal::ExtendSse42(seed, p, n), extended)
          << "sse4.2 seeded, length " << n << " offset " << offset;
#endif
    }
  }
}

TEST(Crc32c, Sse42PathIsBuiltWhereTheTargetHasIt) {
#if defined(__SSE4_2__)
  EXPECT_TRUE(crc32c_internal::kHaveSse42);
#else
  EXPECT_FALSE(crc32c_internal::kHaveSse42);
  GTEST_SKIP() << "built without SSE4.2; only the table path was tested";
#endif
}

TEST(Crc32c, MaskIsTfRecords) {
  // mask(c) = rotr(c, 15) + 0xa282ead8, computed by hand for two values.
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(0x00008000u), 0xa282ead9u);
  // TensorBoard's own masked_crc32c (its pure-Python TFRecord reader) gives
  // 0xc78ab0e5 for "123456789".
  EXPECT_EQ(MaskedCrc32c("123456789"), 0xc78ab0e5u);
  const uint32_t crc = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"),
            static_cast<uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
}

}  // namespace
}  // namespace klserve::server
