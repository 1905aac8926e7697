#include "kernels/cuda/row_fold.h"

#include <cstring>
#include <vector>

#include "kernels/fold_rows.h"
#include "kernels/half.h"
#include "kernels/value_errors.h"

namespace klserve::cuda {
namespace {

// Element j of a float row in `dtype`, as the backends see it (float).
float ElementAt(DType dtype, const std::byte* row, int64_t j) {
  const std::byte* p = row + j * DTypeSize(dtype);
  if (dtype == DType::kFloat32) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return dtype == DType::kBFloat16 ? BFloat16ToFloat(bits)
                                   : Float16ToFloat(bits);
}

}  // namespace

absl::Status RowErrorStatus(const IndexerKlProblem& p, const RowData& data,
                            int64_t r, const DeviceRowResult& row) {
  const RowError error = static_cast<RowError>(row.error);
  RowErrorSite site{
      .b = r / p.T, .t = r % p.T, .h = row.error_head, .j = row.error_slot};
  // The device names the slot; the value there is read from the host input.
  switch (error) {
    case RowError::kLogitsNotFinite:
      site.value =
          ElementAt(data.target.dtype, data.target.Row(r, p.T, site.h), site.j);
      break;
    case RowError::kWeightsBad:
      site.value =
          ElementAt(data.target.dtype, data.target.Row(r, p.T), site.j);
      break;
    case RowError::kScoresNotFinite:
      site.value =
          ElementAt(data.scores.dtype, data.scores.Row(r, p.T), site.j);
      break;
    default:
      break;
  }
  return klserve::RowErrorStatus(error, site);
}

absl::Status FirstRowError(const IndexerKlProblem& problem, const RowData& data,
                           int64_t first_row,
                           absl::Span<const DeviceRowResult> results) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].error != static_cast<uint8_t>(RowError::kNone)) {
      return RowErrorStatus(problem, data, first_row + static_cast<int64_t>(i),
                            results[i]);
    }
  }
  return absl::OkStatus();
}

void FoldRows(const IndexerKlProblem& problem, int64_t first_row,
              absl::Span<const DeviceRowResult> results, double* row_kl,
              LossAccumulator& accumulator) {
  std::vector<RowResult> rows(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const DeviceRowResult& d = results[i];
    rows[i].kind = static_cast<RowResult::Kind>(d.kind);
    rows[i].kl = d.kl;
    rows[i].entropy_p = d.entropy_p;
    rows[i].entropy_q = d.entropy_q;
    rows[i].recall = d.recall;
  }
  klserve::FoldRows(problem, first_row, rows, row_kl, accumulator);
}

}  // namespace klserve::cuda
