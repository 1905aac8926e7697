#ifndef KLSERVE_TESTS_REFERENCE_PROJECTIONS_REFERENCE_H_
#define KLSERVE_TESTS_REFERENCE_PROJECTIONS_REFERENCE_H_

// A float64 reference of the spec's projections form, as plain loops: it
// computes the main logits a and the indexer scores I from the projections,
// hands them to the logits-form reference (indexer_kl_reference.h) for the
// loss and G = dLoss/dI, and applies the chain rule to G. The spec states the
// form as exactly that composition, so the reference follows it literally.
// Small problems only: it materialises [B,H,T,S].

#include <cstdint>
#include <optional>
#include <vector>

#include "tests/reference/indexer_kl_reference.h"

namespace klref {

struct RefProjections {
  int64_t B = 0, T = 0, S = 0;
  int64_t H = 0, H_kv = 0, D = 0;  // main attention; H_kv divides H
  int64_t H_I = 0, D_I = 0;        // lightning indexer

  std::vector<double> query;          // [B,T,H,D]
  std::vector<double> key;            // [B,S,H_kv,D]
  std::vector<double> index_query;    // [B,T,H_I,D_I]
  std::vector<double> index_key;      // [B,S,D_I]
  std::vector<double> index_weights;  // [B,T,H_I]

  // Defaults to H_I^-1/2 * D_I^-1/2.
  std::optional<double> index_weight_scale;
  bool use_relu = true;

  // The sparse stage: K > 0 with either the client's `topk_indices`
  // [B,T,K] or, when it is empty, the reference's own selection.
  int64_t K = 0;
  std::vector<int64_t> topk_indices;

  // Masks, flavour, reduction, c, grad_scale and softmax_scale, as in the
  // logits form; its tensors and shape fields are ignored (they are filled
  // here).
  RefProblem options;
};

struct RefProjectionsResult {
  // The logits form's answer on a and I (gathered to the slots in the
  // sparse stage); its `grad` is G times grad_scale.
  RefResult kl;
  // The selection, when the reference selected: [B,T,K], valid slots
  // first in ascending key order, -1 after.
  std::vector<int64_t> topk_indices;
  // grad_scale times the gradients of the loss, shaped like the inputs.
  std::vector<double> d_index_query;    // [B,T,H_I,D_I]
  std::vector<double> d_index_key;      // [B,S,D_I]
  std::vector<double> d_index_weights;  // [B,T,H_I]
};

RefProjectionsResult ComputeProjectionsReference(const RefProjections& problem);

// The logits-form problem the projections describe: per-head logits
// [B,H,T,L] and scores [B,T,L], L = S (dense) or K (sparse, gathered at
// `topk`, the client's indices or the selection).
RefProblem LogitsFormOf(const RefProjections& problem,
                        const std::vector<int64_t>& topk);

}  // namespace klref

#endif  // KLSERVE_TESTS_REFERENCE_PROJECTIONS_REFERENCE_H_
