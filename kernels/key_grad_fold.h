#ifndef KLSERVE_KERNELS_KEY_GRAD_FOLD_H_
#define KLSERVE_KERNELS_KEY_GRAD_FOLD_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/dtype.h"

// d_index_key sums over query rows. Each tile of query rows contributes its
// part (KeyGradPartial), and the parts are added in tile order, whichever
// thread computed them and when, in double: the sum then has the same bits
// whatever the thread count or the stream's blocks.

namespace klserve {

// A tile's contributions, kept until its turn: row e (D_I floats at
// rows[e * D_I]) adds into key keys[e] of the tile's batch entry, in order
// of e.
struct KeyGradPartial {
  std::vector<float> rows;
  std::vector<int32_t> keys;
  int64_t count = 0;
};

class KeyGradFold {
 public:
  // For [B, S, D_I] (B * S * D_I = size; no sum at all when size is 0).
  KeyGradFold(int64_t size, int64_t S, int64_t D_I);

  // Waits until every tile before `tile` has folded, adds `partial` (unless
  // null: a tile that contributes nothing) into batch entry b's keys, and
  // passes the turn on. Tiles are numbered in row order from 0; each takes
  // its turn once. Without a sum (size 0) it returns at once.
  void Fold(int64_t tile, int64_t b, const KeyGradPartial* partial);

  // The sum, rounded to `dtype` (FP32, BF16 or FP16).
  void Store(DType dtype, std::byte* out) const;

 private:
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> sum_;
  const int64_t S_, width_;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_KEY_GRAD_FOLD_H_
