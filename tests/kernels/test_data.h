#ifndef KLSERVE_TESTS_KERNELS_TEST_DATA_H_
#define KLSERVE_TESTS_KERNELS_TEST_DATA_H_

// Shared helpers of the kernel tests: one description of a request (Case)
// from which both the library's inputs (encoded bytes and views) and the
// float64 reference's problem (decoded from those same bytes) are built;
// seeded random cases; running the library; comparing it with the reference.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/dtype.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "tests/reference/indexer_kl_reference.h"

namespace klserve::testdata {

// A tensor as a test describes it: row-major logical values and the dtype
// they travel in. Float values are rounded to the dtype when encoded (NaN and
// infinities allowed); INT32 values are truncated; BOOL is nonzero = true.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<double> values;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, double fill = 0);

  int64_t num_elements() const;
  // The element at a full multi-index.
  double& at(std::initializer_list<int64_t> index);
  double at(std::initializer_list<int64_t> index) const;
};

// One request: the tensors and the options. Field names follow
// IndexerKlInputs.
struct Case {
  int64_t B = 0, T = 0, S = 0;
  int64_t H = 0;  // heads of attention_logits; 0 for attention_weights
  int64_t K = 0;  // top-k slots; 0 in the dense stage

  std::optional<HostTensor> attention_logits;
  std::optional<HostTensor> attention_weights;
  HostTensor indexer_scores;
  std::optional<HostTensor> topk_indices;
  std::optional<HostTensor> segment_ids_q;
  std::optional<HostTensor> segment_ids_kv;
  std::optional<HostTensor> attention_mask;
  std::optional<HostTensor> key_padding_mask;
  std::optional<HostTensor> row_valid;
  IndexerKlOptions options;

  bool sparse() const { return K > 0; }
  int64_t slots() const { return sparse() ? K : S; }
  int64_t num_rows() const { return B * T; }
  // The target tensor, whichever form it has.
  HostTensor& target();
  const HostTensor& target() const;
};

// Little-endian bytes of a tensor in its dtype.
std::vector<std::byte> EncodeTensor(const HostTensor& tensor);

// The encoded bytes of a case and the library inputs viewing them. Not
// copyable (the views point into the buffers); moving keeps them valid.
class EncodedCase {
 public:
  explicit EncodedCase(const Case& c);
  EncodedCase(const EncodedCase&) = delete;
  EncodedCase& operator=(const EncodedCase&) = delete;
  EncodedCase(EncodedCase&&) = default;
  EncodedCase& operator=(EncodedCase&&) = default;

  // Mutable so that validation tests can break one view.
  IndexerKlInputs& inputs() { return inputs_; }
  const IndexerKlInputs& inputs() const { return inputs_; }
  IndexerKlOptions& options() { return options_; }
  const IndexerKlOptions& options() const { return options_; }

 private:
  TensorView Add(const HostTensor& tensor);

  std::vector<std::vector<std::byte>> buffers_;
  IndexerKlInputs inputs_;
  IndexerKlOptions options_;
};

// The reference's problem, decoded by the reference's own codecs from the
// bytes the library sees.
klref::RefProblem ToReference(const Case& c);

// What the library returned for one case.
struct LibOutput {
  absl::Status status;
  IndexerKlResult result;
  // The gradient as written (grad_dtype) and decoded; untouched elements
  // keep a NaN fill.
  std::vector<std::byte> grad_bytes;
  std::vector<double> grad;
  std::vector<double> row_kl;  // NaN fill
};

// Validates and computes `c` with `backend` (BackendUnderTest() when null,
// test_backends.h), with output buffers of exactly the right size.
LibOutput RunLibrary(const Case& c, Backend* backend = nullptr);

// The loss alone, or NaN on an error.
double LibraryLoss(const Case& c, Backend* backend = nullptr);

// The CPU kernels' variant the suite runs under: the --isa flag of the
// kernel tests' main (isa_test_main.cc), the CPU's best without one.
cpu::Isa TestIsa();
void SetTestIsa(cpu::Isa isa);

// A CPU backend with two threads and TestIsa()'s kernels, shared by the
// tests.
Backend& SharedBackend();

// Decodes `count` elements of `dtype` (FP32, BF16, FP16) with the reference's
// codecs.
std::vector<double> DecodeFloats(const std::byte* data, DType dtype,
                                 int64_t count);

// The distance between two 16-bit floats of one format in units in the last
// place (bit patterns ordered as integers; +0 and -0 are 0 apart).
int64_t UlpDistance16(uint16_t a, uint16_t b);

// ---------------------------------------------------------------------------
// Random cases.

struct CaseSpec {
  int64_t B = 1, T = 4, S = 8;
  InputForm form = InputForm::kDensePerHead;
  int64_t H = 2;  // heads, in the per-head forms
  int64_t K = 0;  // top-k slots, in the sparse forms (> 0 there)
  DType target_dtype = DType::kFloat32;
  DType scores_dtype = DType::kFloat32;

  bool causal = false;
  std::optional<int64_t> q_offset;
  bool segments = false;
  bool attention_mask = false;
  bool key_padding = false;
  bool row_valid = false;

  double logit_spread = 3.0;  // standard deviation of the logits
  double score_spread = 2.0;  // standard deviation of the indexer scores
  double zero_weight_fraction = 0.2;
  double empty_slot_fraction = 0.2;
  // Puts -inf and large finite values at masked positions and empty slots.
  bool garbage_at_invalid = true;

  // Flavor, reduction, c, grad dtype...; want_row_kl and want_diagnostics
  // default to true here.
  IndexerKlOptions options = DefaultOptions();

  static IndexerKlOptions DefaultOptions();
};

// Every input form, in InputForm's order.
inline constexpr InputForm kInputForms[] = {
    InputForm::kDensePerHead, InputForm::kDenseAggregated,
    InputForm::kSparsePerHead, InputForm::kSparseAggregated};
// Every input form, the per-head ones first: the order of the suites that
// loop over the target before the stage (their seeds follow it).
inline constexpr InputForm kInputFormsByTarget[] = {
    InputForm::kDensePerHead, InputForm::kSparsePerHead,
    InputForm::kDenseAggregated, InputForm::kSparseAggregated};

Case MakeRandomCase(const CaseSpec& spec, uint64_t seed);

// A random spec (shapes, form, dtypes, masks, flavour, reduction, c, grad
// dtype) for sweeps.
CaseSpec RandomSpec(std::mt19937_64& rng);

std::string Describe(const CaseSpec& spec);

// ---------------------------------------------------------------------------
// Comparisons (GoogleTest expectations).

struct Tolerance {
  double loss_rel = 1e-5;
  double grad_rel = 1e-4;  // of the reference gradient's max-abs
  bool compare_diagnostics = true;
  // The device breaks a sparse row's recall ties by slot, not by key
  // (docs/cuda.md): such a recall is not compared.
  bool sparse_recall_ties_by_slot = false;
};

// Expects the library's output to match the reference on `c`, and no NaN or
// infinity anywhere.
void ExpectMatchesReference(const Case& c, const LibOutput& lib,
                            const klref::RefResult& ref,
                            const Tolerance& tolerance = {});

// Runs both and compares; returns the reference's result.
klref::RefResult CheckAgainstReference(const Case& c,
                                       const Tolerance& tolerance = {},
                                       Backend* backend = nullptr);

// Expects INVALID_ARGUMENT whose message starts with one of `fields`.
void ExpectInvalidStartingWith(const absl::Status& status,
                               std::initializer_list<std::string_view> fields);
// Expects INVALID_ARGUMENT whose message names one of `fields` as a word.
void ExpectInvalidNaming(const absl::Status& status,
                         std::initializer_list<std::string_view> fields);

// The status of validating a request before computing: Create, then
// WholeRowData.
absl::Status CreateStatus(const EncodedCase& encoded);
// The status of Create followed by ComputeIndexerKl.
absl::Status RunStatus(const Case& c);

}  // namespace klserve::testdata

#endif  // KLSERVE_TESTS_KERNELS_TEST_DATA_H_
