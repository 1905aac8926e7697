#ifndef KLSERVE_TESTS_REFERENCE_INDEXER_KL_REFERENCE_H_
#define KLSERVE_TESTS_REFERENCE_INDEXER_KL_REFERENCE_H_

// An independent float64 reference of the indexer KL loss of
// docs/spec.md, written as plain loops straight from the spec.
// It shares no code with kernels/ (its own structs, its own 16-bit float
// codecs) so that the tests compare two implementations, not one with itself.
// It favours clarity over speed: use it on small problems only.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace klref {

enum class RefFlavor { kExact, kMaxText };
enum class RefReduction { kMean, kMeanValid, kSum };

// One request with every tensor already decoded to double. L below is the
// number of slots per row: K in the sparse stage, S in the dense stage.
struct RefProblem {
  int64_t B = 0, T = 0, S = 0;
  // Heads of `logits`; 0 when the target is the head-aggregated `weights`.
  int64_t H = 0;
  // Top-k slots per row; 0 selects the dense stage.
  int64_t K = 0;

  std::vector<double> logits;   // [B,H,T,L] when H > 0
  std::vector<double> weights;  // [B,T,L] when H == 0
  std::vector<double> scores;   // [B,T,L]
  std::vector<int64_t> topk;    // [B,T,K] when K > 0; outside [0,S): empty

  bool causal = false;
  std::optional<int64_t> q_offset;  // defaults to S - T
  // Empty vectors mean "not given".
  std::vector<int64_t> segment_ids_q;     // [B,T]
  std::vector<int64_t> segment_ids_kv;    // [B,S]
  std::vector<uint8_t> attention_mask;    // [B,T,S], nonzero = may attend
  std::vector<uint8_t> key_padding_mask;  // [B,S]
  std::vector<uint8_t> row_valid;         // [B,T]
  // Per-row key bounds [B,T], both or neither: key s valid for row (b, t)
  // only when key_start <= s < key_end.
  std::vector<int64_t> key_start;
  std::vector<int64_t> key_end;

  double softmax_scale = 1.0;
  RefFlavor flavor = RefFlavor::kExact;
  RefReduction reduction = RefReduction::kMean;
  double scaling_factor = 1.0;  // c
  double grad_scale = 1.0;      // multiplies the gradient only
  int64_t recall_k = 0;

  bool per_head() const { return H > 0; }
  bool sparse() const { return K > 0; }
  int64_t slots() const { return sparse() ? K : S; }
};

struct RefResult {
  // Empty when the data are valid; otherwise the name of the tensor holding
  // the first bad value (rows in order), and nothing else is filled.
  std::string error;

  double loss = 0;             // c * sum KL / N, 0 when N = 0
  double unscaled_loss = 0;    // sum KL / N, 0 when N = 0
  int64_t denominator = 0;     // N
  std::vector<double> row_kl;  // [B*T]: KL of counted rows, 0 elsewhere
  std::vector<double> grad;    // [B,T,L]: dLoss/dscores (includes c / N)

  int64_t rows_counted = 0;       // computed rows that row_valid keeps
  int64_t rows_fully_masked = 0;  // rows with no valid key (any row_valid)
  int64_t rows_zero_target = 0;   // valid keys, target zero on all of them

  // Diagnostics, means over counted rows (0 when none count).
  double mean_entropy_p = 0;
  double mean_entropy_q = 0;
  double topk_recall = 0;
  // Whether some counted row has equal scores on both sides of the recall_k
  // boundary, so that the recall depends on the tie-breaking rule.
  bool recall_tie = false;
  // Whether such a tie is in a sparse row, where the device breaks it by
  // slot rather than by key (docs/cuda.md).
  bool recall_tie_sparse = false;

  // Per-slot distributions [B,T,L] (0 at invalid slots and in rows that are
  // not computed), for tests that need them.
  std::vector<double> p;
  std::vector<double> q;
  // Per-slot validity [B,T,L].
  std::vector<uint8_t> valid;
  // Per-row: whether the row counts (computed and kept by row_valid) [B*T].
  std::vector<uint8_t> row_counted;
};

RefResult ComputeReference(const RefProblem& problem);

// The loss alone (for finite differences); NaN when the data are invalid.
double ReferenceLoss(const RefProblem& problem);

// 16-bit float formats, decoded from and encoded to their bits here, with no
// help from the library. Encoding rounds to nearest, ties to even; values too
// large become infinities; NaN stays NaN.
double DecodeBFloat16(uint16_t bits);
double DecodeFloat16(uint16_t bits);
uint16_t EncodeBFloat16(double value);
uint16_t EncodeFloat16(double value);
double RoundToBFloat16(double value);
double RoundToFloat16(double value);

}  // namespace klref

#endif  // KLSERVE_TESTS_REFERENCE_INDEXER_KL_REFERENCE_H_
