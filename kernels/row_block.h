#ifndef KLSERVE_KERNELS_ROW_BLOCK_H_
#define KLSERVE_KERNELS_ROW_BLOCK_H_

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/problem.h"

namespace klserve {

// The raw bytes of one block of consecutive rows of a problem (the stream's
// way of sending them; WholeRowData in kernels/problem.h is the unary's).
// Layouts (n rows, K slots per row):
//   target: attention_logits [H, n, K] (head-major) or attention_weights
//           [n, K];
//   scores [n, K]; indices [n, K]; mask [n, S].
// A tensor the problem does not use must be empty. The bytes are not copied:
// they must outlive the computation of the block.
struct RowBlockBytes {
  const void* target = nullptr;
  int64_t target_bytes = 0;
  const void* scores = nullptr;
  int64_t scores_bytes = 0;
  const void* indices = nullptr;
  int64_t indices_bytes = 0;
  const void* mask = nullptr;
  int64_t mask_bytes = 0;
};

// One tensor of a block: its field, and its layout [heads, n, width] for a
// block of n rows (absent when the problem does not use it).
struct BlockTensor {
  const char* field;
  bool used;
  DType dtype;
  int64_t heads;
  int64_t width;

  // Its bytes in a block of `rows` rows (0 when unused).
  int64_t BytesOf(int64_t rows) const {
    return used ? heads * rows * width * DTypeSize(dtype) : 0;
  }
};

// The block tensors of `problem`: target, scores, indices, mask.
std::array<BlockTensor, 4> BlockTensorsOf(const IndexerKlProblem& problem);

// Views of a block of rows `rows` of `problem`, after checking that the rows
// lie within the problem and that each tensor holds exactly its rows' bytes
// (INVALID_ARGUMENT naming the tensor otherwise).
absl::StatusOr<RowData> BlockRowData(const IndexerKlProblem& problem,
                                     RowRange rows, const RowBlockBytes& bytes);

}  // namespace klserve

#endif  // KLSERVE_KERNELS_ROW_BLOCK_H_
