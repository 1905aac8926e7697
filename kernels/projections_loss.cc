#include "kernels/projections_loss.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

// The index of the first NaN or infinity of a float tensor, or -1: all ones
// in the exponent field, read from the bits (any dtype, any alignment).
int64_t FirstNonFinite(const TensorView& view, bool infinities_allowed) {
  const auto* bytes = static_cast<const std::byte*>(view.data);
  const int64_t n = view.byte_size / DTypeSize(view.dtype);
  // Blocks of a simple loop that vectorises; the exact index only when a
  // block has one.
  constexpr int64_t kBlock = 4096;
  const auto scan = [&](auto word, auto exponent, auto mantissa) {
    using Word = decltype(word);
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t end = std::min(n, begin + kBlock);
      bool any = false;
      for (int64_t i = begin; i < end; ++i) {
        Word w;
        std::memcpy(&w, bytes + i * sizeof(Word), sizeof(Word));
        const bool special = (w & exponent) == exponent;
        any |= special && (!infinities_allowed || (w & mantissa) != 0);
      }
      if (!any) continue;
      for (int64_t i = begin; i < end; ++i) {
        Word w;
        std::memcpy(&w, bytes + i * sizeof(Word), sizeof(Word));
        if ((w & exponent) == exponent &&
            (!infinities_allowed || (w & mantissa) != 0)) {
          return i;
        }
      }
    }
    return int64_t{-1};
  };
  switch (view.dtype) {
    case DType::kFloat32:
      return scan(uint32_t{}, uint32_t{0x7f800000}, uint32_t{0x007fffff});
    case DType::kBFloat16:
      return scan(uint16_t{}, uint16_t{0x7f80}, uint16_t{0x007f});
    case DType::kFloat16:
      return scan(uint16_t{}, uint16_t{0x7c00}, uint16_t{0x03ff});
    default:
      return -1;
  }
}

// "<field>: <rule>, got <found> at (b=.., t=.., ...)" for element i of a
// tensor whose dimensions are named by `letters` (one per dimension).
absl::Status ValueError(absl::string_view field, const TensorView& view,
                        const char* letters, int64_t i, const char* rule,
                        const char* found) {
  std::string where;
  int64_t rest = i;
  std::vector<int64_t> index(view.shape.size());
  for (int64_t d = static_cast<int64_t>(view.shape.size()) - 1; d >= 0; --d) {
    index[d] = rest % view.shape[d];
    rest /= view.shape[d];
  }
  for (size_t d = 0; d < index.size(); ++d) {
    absl::StrAppend(&where, d == 0 ? "" : ", ", std::string(1, letters[d]), "=",
                    index[d]);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", rule, ", got ", found, " at (", where, ")"));
}

absl::Status CheckValues(const ProjectionsProblem& p) {
  const struct {
    const char* field;
    const TensorView& view;
    const char* letters;
  } projections[] = {
      {"query", p.query, "bthd"},
      {"key", p.key, "bshd"},
      {"index_query", p.index_query, "bthd"},
      {"index_key", p.index_key, "bsd"},
      {"index_weights", p.index_weights, "bth"},
  };
  for (const auto& [field, view, letters] : projections) {
    if (const int64_t i = FirstNonFinite(view, false); i >= 0) {
      return ValueError(field, view, letters, i, "every value must be finite",
                        "NaN or infinity");
    }
  }
  // The lse is ignored on rows without a valid key, where +inf is usual.
  if (p.lse) {
    if (const int64_t i = FirstNonFinite(*p.lse, true); i >= 0) {
      return ValueError("lse", *p.lse, "bht", i, "must hold no NaN", "NaN");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const ProjectionsProblem& p,
                          const ProjectionsOutputs& out) {
  const IndexerKlOptions& options = p.logits.options;
  if (options.want_grad &&
      (out.d_index_query == nullptr || out.d_index_key == nullptr ||
       out.d_index_weights == nullptr)) {
    return absl::InvalidArgumentError(
        "d_index_query, d_index_key, d_index_weights: output buffers are "
        "required for the gradient");
  }
  if (options.want_row_kl && out.row_kl == nullptr) {
    return absl::InvalidArgumentError("row_kl: an output buffer is required");
  }
  if (p.server_topk && out.topk_indices == nullptr) {
    return absl::InvalidArgumentError(
        "topk_indices: an output buffer is required for the selection");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IndexerKlResult> ComputeProjectionsLoss(
    Backend& backend, const ProjectionsProblem& problem,
    const ProjectionsOutputs& outputs) {
  RETURN_IF_ERROR(CheckOutputs(problem, outputs));
  RETURN_IF_ERROR(CheckValues(problem));
  LossAccumulator accumulator;
  int64_t denominator = 0;
  RETURN_IF_ERROR(
      backend.ComputeProjections(problem, outputs, accumulator, denominator));
  return LossResultOf(problem.logits, accumulator, denominator);
}

}  // namespace klserve
