#ifndef KLSERVE_KERNELS_PROJECTIONS_PROBLEM_H_
#define KLSERVE_KERNELS_PROJECTIONS_PROBLEM_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/problem.h"
#include "kernels/tensor_view.h"

// The projections form of docs/spec.md: the job sends the main attention's
// q and k and the lightning indexer's q_I, k_I and head weights; the service
// recomputes the main logits a and the indexer scores I tile by tile, never
// holding a [T, S] or [H, T, S] tensor, and returns the gradients of the
// indexer's inputs.
//
// Letters: B batch, T query rows, S keys, H main heads of dimension D, H_kv
// key heads (H_kv divides H), H_I indexer heads of dimension D_I, K top-k
// slots.

namespace klserve {

struct ProjectionsInputs {
  TensorView query;          // [B,T,H,D]
  TensorView key;            // [B,S,H_kv,D]
  TensorView index_query;    // [B,T,H_I,D_I]
  TensorView index_key;      // [B,S,D_I]
  TensorView index_weights;  // [B,T,H_I]
  // FP32 [B,H,T]: each head's log-sum-exp over the row's valid keys (in the
  // sparse stage: over the valid slots of topk_indices).
  std::optional<TensorView> lse;
  // The sparse stage with the client's selection, [B,T,K] INT32.
  std::optional<TensorView> topk_indices;
  // The masks, as in IndexerKlInputs.
  std::optional<TensorView> segment_ids_q;
  std::optional<TensorView> segment_ids_kv;
  std::optional<TensorView> attention_mask;
  std::optional<TensorView> key_padding_mask;
  std::optional<TensorView> row_valid;
  std::optional<TensorView> key_start;
  std::optional<TensorView> key_end;
};

struct ProjectionsOptions {
  // Masks, flavour, reduction, c, grad_scale, grad dtype, row KL and
  // diagnostics as in the logits form. softmax_scale multiplies q . k;
  // num_keys is 0 or S.
  IndexerKlOptions loss;
  // Multiplies index_weights; default H_I^-1/2 * D_I^-1/2. Finite.
  std::optional<double> index_weight_scale;
  bool use_relu = true;
  // > 0: the sparse stage with the service's own selection of K keys per
  // row. Not with topk_indices or lse.
  int64_t topk = 0;
};

// A validated projections problem. Only Create makes one. Value rules that
// need the data (NaN or infinities in the projections, scores that overflow
// float32, the lse's head mass, index ranges) are checked as it computes.
class ProjectionsProblem {
 public:
  // Checks shapes, dtypes and options; errors are INVALID_ARGUMENT
  // "<field>: <rule>, got <value>".
  static absl::StatusOr<ProjectionsProblem> Create(
      const ProjectionsInputs& inputs, const ProjectionsOptions& options);

  int64_t B = 0, T = 0, S = 0;
  int64_t H = 0, H_kv = 0, D = 0;
  int64_t H_I = 0, D_I = 0;
  // K in the sparse stage (client indices or topk), 0 in the dense stage.
  int64_t K = 0;
  bool server_topk = false;
  float index_weight_scale = 0;
  bool use_relu = true;

  // The logits-form problem that a and I describe: per-head, over S keys
  // (dense) or K slots (sparse). Its masks, options, N and row rules are
  // the projections form's; its per-row tensors carry no bytes here: the
  // computation forms them tile by tile.
  IndexerKlProblem logits;
  // With server_topk: the dense problem over all S keys that the selection
  // ranks the valid keys of.
  std::optional<IndexerKlProblem> selection;

  // The inputs' views (checked to hold their bytes).
  TensorView query, key, index_query, index_key, index_weights;
  std::optional<TensorView> lse;
  std::optional<TensorView> topk_indices;    // the client's
  std::optional<TensorView> attention_mask;  // [B,T,S] BOOL

  bool sparse() const { return K > 0; }

 private:
  explicit ProjectionsProblem(IndexerKlProblem logits)
      : logits(std::move(logits)) {}
};

// Caller-owned outputs, in options.loss.grad_dtype and shaped like the
// inputs; the gradient buffers are required when options.loss.want_grad.
struct ProjectionsOutputs {
  std::byte* d_index_query = nullptr;    // [B,T,H_I,D_I]
  std::byte* d_index_key = nullptr;      // [B,S,D_I]
  std::byte* d_index_weights = nullptr;  // [B,T,H_I]
  // [B,T,K] when the service selects (server_topk).
  int32_t* topk_indices = nullptr;
  // [B,T] when options.loss.want_row_kl.
  double* row_kl = nullptr;
};

}  // namespace klserve

#endif  // KLSERVE_KERNELS_PROJECTIONS_PROBLEM_H_
