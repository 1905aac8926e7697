#include "client/kernel_load.h"

#include <cstddef>
#include <vector>

#include "client/tensor_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "kernels/projections_loss.h"
#include "kernels/projections_output_buffers.h"
#include "kernels/projections_problem.h"
#include "kernels/status_macros.h"
#include "server/codec/call_regions.h"
#include "server/codec/tensor_codec.h"

namespace klserve {
namespace {

// One worker's output buffers, sized on its first call.
struct Outputs {
  std::vector<std::byte> grad;
  std::vector<double> row_kl;
  ProjectionsOutputBuffers projections;
};

// Sizes `buffer` to `count` elements once; its data.
template <typename T>
T* Sized(std::vector<T>& buffer, int64_t count) {
  buffer.resize(count);
  return buffer.data();
}

absl::StatusOr<int64_t> ComputeLogits(Backend& backend,
                                      const v1::ComputeLossRequest& request,
                                      Outputs& out) {
  server::CallRegions no_regions(nullptr);  // the bench's tensors are inline
  ASSIGN_OR_RETURN(const IndexerKlInputs inputs,
                   server::InputsFrom(request, no_regions));
  ASSIGN_OR_RETURN(const IndexerKlOptions options,
                   server::OptionsFrom(request.options()));
  ASSIGN_OR_RETURN(const IndexerKlProblem problem,
                   IndexerKlProblem::Create(inputs, options));
  ASSIGN_OR_RETURN(const RowData rows, WholeRowData(problem, inputs));
  const int64_t num_rows = problem.B * problem.T;
  LossOutputs outputs;
  if (options.want_grad) {
    outputs.grad_byte_size =
        num_rows * problem.row_length * DTypeSize(options.grad_dtype);
    outputs.grad = Sized(out.grad, outputs.grad_byte_size);
  }
  if (options.want_row_kl) {
    outputs.row_kl = Sized(out.row_kl, num_rows);
    outputs.row_kl_size = num_rows;
  }
  RETURN_IF_ERROR(ComputeIndexerKl(backend, problem, rows, outputs).status());
  return outputs.grad_byte_size;
}

absl::StatusOr<int64_t> ComputeProjections(
    Backend& backend, const v1::ComputeLossRequest& request, Outputs& out) {
  server::CallRegions no_regions(nullptr);
  ASSIGN_OR_RETURN(const ProjectionsInputs inputs,
                   server::ProjectionsInputsFrom(request, no_regions));
  ASSIGN_OR_RETURN(const ProjectionsOptions options,
                   server::ProjectionsOptionsFrom(request.options()));
  ASSIGN_OR_RETURN(const ProjectionsProblem problem,
                   ProjectionsProblem::Create(inputs, options));
  ASSIGN_OR_RETURN(const ProjectionsRowData rows,
                   WholeProjectionsRows(problem, inputs));
  const ProjectionsOutputs outputs = out.projections.For(problem);
  RETURN_IF_ERROR(
      ComputeProjectionsLoss(backend, problem, rows, outputs).status());
  return out.projections.gradient_bytes();
}

}  // namespace

LoadResult RunKernelLoad(const v1::ComputeLossRequest& request, int threads,
                         const LoadLimits& limits) {
  CpuBackend backend(threads);
  std::vector<Outputs> outputs(limits.concurrency);
  const int64_t request_bytes = RequestTensorBytes(request);
  const bool projections = request.has_query();
  return RunWorkers(limits, [&](int worker) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(const int64_t grad_bytes,
                     projections
                         ? ComputeProjections(backend, request, outputs[worker])
                         : ComputeLogits(backend, request, outputs[worker]));
    return request_bytes + grad_bytes;
  });
}

}  // namespace klserve
