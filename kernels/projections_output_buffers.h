#ifndef KLSERVE_KERNELS_PROJECTIONS_OUTPUT_BUFFERS_H_
#define KLSERVE_KERNELS_PROJECTIONS_OUTPUT_BUFFERS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/projections_computation.h"
#include "kernels/projections_loss.h"
#include "kernels/projections_problem.h"

// Memory of its own for a whole problem's outputs, for the callers that keep
// them rather than answer with them: the kernel load generator and the
// fuzzer. (The service writes each output into its response or a region.)

namespace klserve {

class ProjectionsOutputBuffers {
 public:
  // Sizes the buffers for each output `problem` asks for (keeping what they
  // had: a caller sizing them for every call of one problem allocates once)
  // and returns them. The problem's bytes must be bounded by its inputs',
  // as ProjectionsProblem::Create checks.
  ProjectionsOutputs For(const ProjectionsProblem& problem);

  // The gradients' bytes in the outputs last returned: d_index_query,
  // d_index_weights and d_index_key.
  int64_t gradient_bytes() const { return gradient_bytes_; }

 private:
  // In ProjectionsRowOutputTensors' order; a vector's buffer is aligned for
  // int32 and double.
  std::array<std::vector<std::byte>, kNumProjectionsRowOutputs> rows_;
  std::vector<std::byte> d_index_key_;
  int64_t gradient_bytes_ = 0;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_PROJECTIONS_OUTPUT_BUFFERS_H_
