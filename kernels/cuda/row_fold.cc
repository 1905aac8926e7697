#include "kernels/cuda/row_fold.h"

#include <cstring>

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
  const int64_t b = r / p.T, t = r % p.T;
  const int64_t j = row.error_slot;
  const int64_t h = row.error_head;
  // The rules and their wording are the CPU backend's (row_target.cc,
  // row_loss.cc).
  switch (static_cast<RowError>(row.error)) {
    case RowError::kNone:
      return absl::OkStatus();
    case RowError::kLogitsNotFinite:
      return ValueError("attention_logits", "logits must not be NaN or +inf",
                        DescribeValue(ElementAt(data.target.dtype,
                                                data.target.Row(r, p.T, h), j)),
                        {b, h, t, j});
    case RowError::kLogitsAllMinusInf:
      return ValueError("attention_logits",
                        "a head needs a finite logit at some valid key",
                        "-inf at every valid key", {b, h, t});
    case RowError::kWeightsBad:
      return ValueError("attention_weights", "weights must be finite and >= 0",
                        DescribeValue(ElementAt(data.target.dtype,
                                                data.target.Row(r, p.T), j)),
                        {b, t, j});
    case RowError::kScoresNotFinite:
      return ValueError("indexer_scores", "scores must not be NaN or +inf",
                        DescribeValue(ElementAt(data.scores.dtype,
                                                data.scores.Row(r, p.T), j)),
                        {b, t, j});
    case RowError::kScoresAllMinusInf:
      return ValueError("indexer_scores",
                        "a row with valid keys needs a finite score at one",
                        "-inf at every valid key", {b, t});
    case RowError::kMinusInfWithMass:
      return ValueError("indexer_scores",
                        "EXACT needs a finite score wherever the target has "
                        "mass (the KL would be infinite; MAXTEXT computes it)",
                        "-inf", {b, t, j});
  }
  return absl::InternalError("cuda: unknown row error code");
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
  for (size_t i = 0; i < results.size(); ++i) {
    const DeviceRowResult& d = results[i];
    RowResult row;
    row.kind = static_cast<RowResult::Kind>(d.kind);
    row.kl = d.kl;
    row.entropy_p = d.entropy_p;
    row.entropy_q = d.entropy_q;
    row.recall = d.recall;
    const bool counts = RowCounts(problem, first_row + static_cast<int64_t>(i));
    accumulator.Add(row, counts);
    if (row_kl != nullptr) {
      row_kl[i] =
          counts && row.kind == RowResult::Kind::kComputed ? row.kl : 0.0;
    }
  }
}

}  // namespace klserve::cuda
