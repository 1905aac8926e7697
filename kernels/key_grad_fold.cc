#include "kernels/key_grad_fold.h"

#include <cstring>

#include "kernels/half.h"

namespace klserve {

KeyGradFold::KeyGradFold(int64_t size, int64_t S, int64_t D_I)
    : sum_(size, 0.0), S_(S), width_(D_I) {}

void KeyGradFold::Fold(int64_t tile, int64_t b, const KeyGradPartial* partial) {
  // Without a sum there is no order to keep: a thread that finished its tile
  // need not wait for the tiles before it.
  if (sum_.empty()) return;
  absl::MutexLock lock(&mu_);
  const auto turn = [this, tile] {
    mu_.AssertReaderHeld();
    return next_ == tile;
  };
  mu_.Await(absl::Condition(&turn));
  if (partial != nullptr) {
    for (int64_t e = 0; e < partial->count; ++e) {
      double* row = sum_.data() + (b * S_ + partial->keys[e]) * width_;
      const float* add = partial->rows.data() + e * width_;
      for (int64_t d = 0; d < width_; ++d) row[d] += add[d];
    }
  }
  ++next_;
}

void KeyGradFold::Store(DType dtype, std::byte* out) const {
  for (size_t i = 0; i < sum_.size(); ++i) {
    const float v = static_cast<float>(sum_[i]);
    if (dtype == DType::kFloat32) {
      std::memcpy(out + 4 * i, &v, 4);
      continue;
    }
    const uint16_t bits =
        dtype == DType::kBFloat16 ? FloatToBFloat16(v) : FloatToFloat16(v);
    std::memcpy(out + 2 * i, &bits, 2);
  }
}

}  // namespace klserve
