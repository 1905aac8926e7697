// ShapeBytes (kernels/shape_bytes.h), the one product of a shape's bytes
// that every size check takes, against products in 128-bit integers.

#include "kernels/shape_bytes.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace klserve {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The product in 128 bits, or nullopt past int64.
std::optional<int64_t> Wide(int64_t element_bytes,
                            const std::vector<int64_t>& dims) {
  __int128 product = element_bytes;
  for (const int64_t dim : dims) {
    product *= dim;
    if (product > kMax || product < -kMax - 1) return std::nullopt;
  }
  return static_cast<int64_t>(product);
}

TEST(ShapeBytes, AnEmptyShapeIsOneElement) { EXPECT_EQ(ShapeBytes(4, {}), 4); }

TEST(ShapeBytes, AZeroDimensionGivesZeroBytes) {
  EXPECT_EQ(ShapeBytes(2, {3, 0, 5}), 0);
}

TEST(ShapeBytes, TheLargestProductFitsAndOneMoreDoesNot) {
  // 2^63 - 1 = 7^2 * 73 * 127 * 337 * 92737 * 649657.
  const std::vector<int64_t> fits = {7, 7, 73, 127, 337, 92737, 649657};
  EXPECT_EQ(ShapeBytes(1, fits), kMax);
  EXPECT_EQ(ShapeBytes(2, fits), std::nullopt);
  EXPECT_EQ(ShapeBytes(4, {int64_t{1} << 30, int64_t{1} << 31}), std::nullopt);
  EXPECT_EQ(ShapeBytes(4, {int64_t{1} << 30, int64_t{1} << 30}),
            int64_t{1} << 62);
}

TEST(ShapeBytes, AnOverflowAnywhereIsReportedEvenBeforeAZero) {
  // Each product is checked as it is made: one past int64 is refused even
  // where a later zero would bring the whole to 0.
  EXPECT_EQ(ShapeBytes(4, {int64_t{1} << 62, 0}), std::nullopt);
  EXPECT_EQ(ShapeBytes(1, {2, 3, int64_t{1} << 62}), std::nullopt);
}

TEST(ShapeBytes, AgreesWithWideProductsOverManyShapes) {
  const std::vector<int64_t> values = {1,          2,
                                       3,          255,
                                       4096,       65535,
                                       1 << 20,    int64_t{1} << 31,
                                       3037000499, int64_t{1} << 40};
  for (const int64_t element : {1, 2, 4, 8}) {
    for (const int64_t a : values) {
      for (const int64_t b : values) {
        for (const int64_t c : values) {
          EXPECT_EQ(ShapeBytes(element, {a, b, c}), Wide(element, {a, b, c}))
              << element << " * " << a << " * " << b << " * " << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace klserve
