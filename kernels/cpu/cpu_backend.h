#ifndef KLSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define KLSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <string_view>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace klserve {

// The multi-threaded CPU backend. Its thread pool is created once; rows are
// spread across it in chunks, and each chunk reuses one scratch row set.
class CpuBackend final : public Backend {
 public:
  // num_threads <= 0 uses every core.
  explicit CpuBackend(int num_threads = 0);

  std::string_view name() const override { return "cpu"; }
  std::string device() const override;
  int threads() const override { return pool_.num_threads(); }
  bool Supports(const IndexerKlProblem&) const override { return true; }
  absl::Status ComputeRows(const IndexerKlProblem& problem, const RowData& data,
                           RowRange rows, const BlockOutputs& outputs,
                           LossAccumulator& accumulator) override;


 private:
  cpu::ThreadPool pool_;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_CPU_CPU_BACKEND_H_
