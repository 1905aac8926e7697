#ifndef KLSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define KLSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <string_view>

#include "kernels/backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace klserve {

// The multi-threaded CPU backend. Its thread pool is created once; rows are
// spread across it in chunks, each computed by one ISA variant's kernels
// (kernels/cpu/isa.h) with one scratch row set, and folded in row order.
class CpuBackend final : public Backend {
 public:
  // num_threads <= 0 uses every core. `isa` must be one this CPU runs
  // (ResolveIsa checks a flag's word); every variant gives the same bits.
  explicit CpuBackend(int num_threads = 0, cpu::Isa isa = cpu::BestIsa());

  std::string_view name() const override { return "cpu"; }
  std::string device() const override;
  int threads() const override { return pool_.num_threads(); }
  absl::Status ComputeRows(const IndexerKlProblem& problem, const RowData& data,
                           RowRange rows, const BlockOutputs& outputs,
                           LossAccumulator& accumulator) override;
  absl::Status ComputeProjectionRows(const ProjectionsProblem& problem,
                                     const ProjectionsRowData& data,
                                     RowRange rows,
                                     const ProjectionsRowOutputs& outputs,
                                     RowResult* results, KeyGradFold& key_grad,
                                     const StopCheck& stop) override;
  absl::StatusOr<int64_t> CountProjectionRowsWithKeys(
      const ProjectionsProblem& problem, const ProjectionsRowData& data,
      RowRange rows, const StopCheck& stop) override;

  // The variant it computes with (its exp sets the benchmark's ceiling).
  const cpu::IsaKernels& kernels() const { return kernels_; }

 private:
  // Whether the projections form's BLAS loaded (kernels/cpu/blas.h). First,
  // so that loading it, which sets environment variables, happens before
  // the pool starts its threads.
  const absl::Status blas_;
  cpu::ThreadPool pool_;
  const cpu::IsaKernels& kernels_;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_CPU_CPU_BACKEND_H_
