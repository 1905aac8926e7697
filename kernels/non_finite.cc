#include "kernels/non_finite.h"

#include <algorithm>
#include <cstring>

namespace klserve {
namespace {

// Whether the float bits w are a NaN or (unless allowed) an infinity: all
// ones in the exponent field.
template <typename Word>
bool IsBad(Word w, Word exponent, Word mantissa, bool infinities_allowed) {
  return (w & exponent) == exponent &&
         (!infinities_allowed || (w & mantissa) != 0);
}

}  // namespace

int64_t FirstNonFinite(DType dtype, const std::byte* data, int64_t n,
                       bool infinities_allowed) {
  constexpr int64_t kBlock = 4096;
  const auto scan = [&](auto word, auto exponent, auto mantissa) {
    using Word = decltype(word);
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t end = std::min(n, begin + kBlock);
      bool any = false;
      for (int64_t i = begin; i < end; ++i) {
        Word w;
        std::memcpy(&w, data + i * sizeof(Word), sizeof(Word));
        any |= IsBad<Word>(w, exponent, mantissa, infinities_allowed);
      }
      if (!any) continue;
      for (int64_t i = begin; i < end; ++i) {
        Word w;
        std::memcpy(&w, data + i * sizeof(Word), sizeof(Word));
        if (IsBad<Word>(w, exponent, mantissa, infinities_allowed)) return i;
      }
    }
    return int64_t{-1};
  };
  switch (dtype) {
    case DType::kFloat32:
      return scan(uint32_t{}, uint32_t{0x7f800000}, uint32_t{0x007fffff});
    case DType::kBFloat16:
      return scan(uint16_t{}, uint16_t{0x7f80}, uint16_t{0x007f});
    case DType::kFloat16:
      return scan(uint16_t{}, uint16_t{0x7c00}, uint16_t{0x03ff});
    default:
      return -1;
  }
}

}  // namespace klserve
