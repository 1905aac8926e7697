#include "kernels/projections_output_buffers.h"

#include "kernels/dtype.h"
#include "kernels/shape_bytes.h"

namespace klserve {

ProjectionsOutputs ProjectionsOutputBuffers::For(
    const ProjectionsProblem& problem) {
  ProjectionsOutputs outputs{.rows = {.capacity_rows = problem.num_rows()}};
  gradient_bytes_ = 0;
  const auto tensors = ProjectionsRowOutputTensors(problem);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ProjectionsRowOutputTensor& tensor = tensors[i];
    if (!tensor.wanted) continue;
    const int64_t bytes = problem.num_rows() * tensor.row_bytes();
    rows_[i].resize(bytes);
    tensor.SetIn(outputs.rows, rows_[i].data());
    if (tensor.gradient) gradient_bytes_ += bytes;
  }
  if (problem.logits.options.want_grad) {
    // Within 64 bits: as many elements as index_key, which is in memory.
    const int64_t bytes =
        *ShapeBytes(DTypeSize(problem.logits.options.grad_dtype),
                    problem.key_gradient_shape());
    d_index_key_.resize(bytes);
    outputs.d_index_key = d_index_key_.data();
    gradient_bytes_ += bytes;
  }
  return outputs;
}

}  // namespace klserve
