#ifndef KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
#define KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/problem.h"

namespace klserve::cpu {

// Buffers one worker reuses for every row of its chunk, sized once from the
// problem so that nothing is allocated per row.
struct RowScratch {
  explicit RowScratch(const IndexerKlProblem& problem)
      : target(problem.K),
        scores(problem.K),
        w(problem.K),
        e(problem.K),
        grad(problem.K),
        valid(problem.K),
        seen(problem.sparse ? problem.S : 0),
        ranked(problem.options.recall_k > 0 ? problem.K : 0) {}

  std::vector<float> target;  // a converted target row (one head)
  std::vector<float> scores;  // the converted scores row
  std::vector<float> w;       // target weights, zero on invalid slots
  std::vector<float> e;       // exponentials of the row being worked on
  std::vector<float> grad;    // gradient before conversion to its dtype
  std::vector<uint8_t> valid;
  // Sparse duplicate check: seen[key] == row + 1 once the row named the key.
  std::vector<uint32_t> seen;
  std::vector<std::pair<float, int32_t>> ranked;  // top-k recall
};

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ROW_SCRATCH_H_
