#include "tests/reference/indexer_kl_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace klref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxTextEps = 1e-8;

// ---------------------------------------------------------------------------
// 16-bit floats: sign, `exponent_bits` biased exponent, `mantissa_bits`.

struct Format {
  int exponent_bits;
  int mantissa_bits;

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int min_exponent() const { return 1 - bias(); }
  int max_exponent() const { return bias(); }
  int exponent_mask() const { return (1 << exponent_bits) - 1; }
  double max_finite() const {
    return std::ldexp((1 << (mantissa_bits + 1)) - 1,
                      max_exponent() - mantissa_bits);
  }
};

constexpr Format kBFloat16{8, 7};
constexpr Format kFloat16{5, 10};

double Decode(uint16_t bits, Format f) {
  const bool negative = (bits >> 15) != 0;
  const int exponent = (bits >> f.mantissa_bits) & f.exponent_mask();
  const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
  double magnitude;
  if (exponent == f.exponent_mask()) {
    magnitude = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN() : kInf;
  } else if (exponent == 0) {  // zero or subnormal
    magnitude = std::ldexp(mantissa, f.min_exponent() - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(mantissa + (1 << f.mantissa_bits),
                           exponent - f.bias() - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

double Round(double value, Format f) {
  if (std::isnan(value) || std::isinf(value) || value == 0) return value;
  const double magnitude = std::fabs(value);
  const int exponent = std::max<int>(std::ilogb(magnitude), f.min_exponent());
  const double quantum = std::ldexp(1.0, exponent - f.mantissa_bits);
  // nearbyint rounds half to even in the default rounding mode.
  double rounded = std::nearbyint(magnitude / quantum) * quantum;
  if (rounded > f.max_finite()) rounded = kInf;
  return std::copysign(rounded, value);
}

uint16_t Encode(double value, Format f) {
  const double rounded = Round(value, f);
  const uint32_t sign = std::signbit(rounded) ? 0x8000u : 0u;
  const uint32_t exponent_all_ones = static_cast<uint32_t>(f.exponent_mask())
                                     << f.mantissa_bits;
  if (std::isnan(rounded)) {
    return static_cast<uint16_t>(sign | exponent_all_ones |
                                 (1u << (f.mantissa_bits - 1)));
  }
  if (std::isinf(rounded)) {
    return static_cast<uint16_t>(sign | exponent_all_ones);
  }
  if (rounded == 0) return static_cast<uint16_t>(sign);
  const double magnitude = std::fabs(rounded);
  const int exponent = std::ilogb(magnitude);
  if (exponent < f.min_exponent()) {  // subnormal
    const auto mantissa = static_cast<uint32_t>(
        std::ldexp(magnitude, f.mantissa_bits - f.min_exponent()));
    return static_cast<uint16_t>(sign | mantissa);
  }
  const auto mantissa =
      static_cast<uint32_t>(std::ldexp(magnitude, f.mantissa_bits - exponent) -
                            (1 << f.mantissa_bits));
  const auto biased = static_cast<uint32_t>(exponent + f.bias());
  return static_cast<uint16_t>(sign | (biased << f.mantissa_bits) | mantissa);
}

// ---------------------------------------------------------------------------
// The loss.

bool KeyValid(const RefProblem& pr, int64_t b, int64_t t, int64_t s) {
  if (pr.causal) {
    const int64_t q_offset = pr.q_offset.value_or(pr.S - pr.T);
    if (s > t + q_offset) return false;
  }
  if (!pr.segment_ids_q.empty()) {
    const int64_t kv = pr.segment_ids_kv[b * pr.S + s];
    if (kv < 0 || pr.segment_ids_q[b * pr.T + t] != kv) return false;
  }
  if (!pr.attention_mask.empty() &&
      pr.attention_mask[(b * pr.T + t) * pr.S + s] == 0) {
    return false;
  }
  if (!pr.key_padding_mask.empty() && pr.key_padding_mask[b * pr.S + s] == 0) {
    return false;
  }
  if (!pr.key_start.empty() &&
      (s < pr.key_start[b * pr.T + t] || s >= pr.key_end[b * pr.T + t])) {
    return false;
  }
  return true;
}

// What one row contributes before the reduction.
struct RowOutcome {
  enum class Kind { kComputed, kFullyMasked, kZeroTarget };
  Kind kind = Kind::kFullyMasked;
  double kl = 0;
  double entropy_p = 0;
  double entropy_q = 0;
  double recall = 0;
  bool recall_tie = false;
  std::vector<double> p, q, dkl;  // [L]; dkl = dKL/dscores
  std::vector<uint8_t> valid;     // [L]
};

// Computes row (b, t); returns the name of the bad tensor on a data error.
std::string ComputeRow(const RefProblem& pr, int64_t b, int64_t t,
                       RowOutcome& out) {
  const int64_t L = pr.slots();
  const int64_t r = b * pr.T + t;
  out = RowOutcome();
  out.p.assign(L, 0.0);
  out.q.assign(L, 0.0);
  out.dkl.assign(L, 0.0);
  out.valid.assign(L, 0);

  // Slot validity, index errors.
  std::vector<uint8_t> seen(pr.S, 0);
  for (int64_t j = 0; j < L; ++j) {
    int64_t key = j;
    if (pr.sparse()) {
      key = pr.topk[r * pr.K + j];
      // -1, or any index outside [0, S), names no key: an empty slot.
      if (key < 0 || key >= pr.S) continue;
      if (seen[key]) return "topk_indices";
      seen[key] = 1;
    }
    out.valid[j] = KeyValid(pr, b, t, key) ? 1 : 0;
  }

  // Value errors, wherever they sit.
  if (pr.per_head()) {
    for (int64_t h = 0; h < pr.H; ++h) {
      for (int64_t j = 0; j < L; ++j) {
        const double a = pr.logits[((b * pr.H + h) * pr.T + t) * L + j];
        if (std::isnan(a) || a == kInf) return "attention_logits";
      }
    }
  } else {
    for (int64_t j = 0; j < L; ++j) {
      const double w = pr.weights[r * L + j];
      if (std::isnan(w) || w < 0 || w == kInf) return "attention_weights";
    }
  }
  for (int64_t j = 0; j < L; ++j) {
    const double s = pr.scores[r * L + j];
    if (std::isnan(s) || s == kInf) return "indexer_scores";
  }

  const int64_t num_valid = std::count(out.valid.begin(), out.valid.end(), 1);
  if (num_valid == 0) {
    out.kind = RowOutcome::Kind::kFullyMasked;
    return "";
  }

  // Target p.
  std::vector<double> x(L, 0.0);  // unnormalised target
  if (pr.per_head()) {
    for (int64_t h = 0; h < pr.H; ++h) {
      const double* a = &pr.logits[((b * pr.H + h) * pr.T + t) * L];
      double m = -kInf;
      for (int64_t j = 0; j < L; ++j) {
        if (out.valid[j]) m = std::max(m, pr.softmax_scale * a[j]);
      }
      if (m == -kInf) return "attention_logits";
      double sum = 0;
      for (int64_t j = 0; j < L; ++j) {
        if (out.valid[j]) sum += std::exp(pr.softmax_scale * a[j] - m);
      }
      for (int64_t j = 0; j < L; ++j) {
        if (out.valid[j]) x[j] += std::exp(pr.softmax_scale * a[j] - m) / sum;
      }
    }
  } else {
    for (int64_t j = 0; j < L; ++j) {
      if (out.valid[j]) x[j] = pr.weights[r * L + j];
    }
  }
  double x_sum = 0;
  for (int64_t j = 0; j < L; ++j) x_sum += x[j];
  const bool zero_target = x_sum == 0;
  if (!zero_target) {
    double denominator;
    if (pr.flavor == RefFlavor::kMaxText) {
      denominator = x_sum + kMaxTextEps;
    } else {
      denominator = pr.per_head() ? static_cast<double>(pr.H) : x_sum;
    }
    for (int64_t j = 0; j < L; ++j) out.p[j] = x[j] / denominator;
  }

  // Indexer distribution q, through log-softmax.
  const double* scores = &pr.scores[r * L];
  double m = -kInf;
  for (int64_t j = 0; j < L; ++j) {
    if (out.valid[j]) m = std::max(m, scores[j]);
  }
  if (m == -kInf) return "indexer_scores";
  double sum = 0;
  for (int64_t j = 0; j < L; ++j) {
    if (out.valid[j]) sum += std::exp(scores[j] - m);
  }
  const double log_sum = m + std::log(sum);
  std::vector<double> log_q(L, -kInf);
  for (int64_t j = 0; j < L; ++j) {
    if (!out.valid[j]) continue;
    log_q[j] = scores[j] - log_sum;
    out.q[j] = std::exp(log_q[j]);
  }
  if (pr.flavor == RefFlavor::kExact) {
    for (int64_t j = 0; j < L; ++j) {
      if (out.valid[j] && out.p[j] > 0 && scores[j] == -kInf) {
        return "indexer_scores";
      }
    }
  }

  if (zero_target) {
    out.kind = RowOutcome::Kind::kZeroTarget;
    return "";
  }
  out.kind = RowOutcome::Kind::kComputed;

  // KL and its gradient.
  if (pr.flavor == RefFlavor::kExact) {
    for (int64_t j = 0; j < L; ++j) {
      if (!out.valid[j]) continue;
      if (out.p[j] > 0) out.kl += out.p[j] * (std::log(out.p[j]) - log_q[j]);
      out.dkl[j] = out.q[j] - out.p[j];
    }
  } else {
    std::vector<double> g(L, 0.0);
    double qg = 0;
    for (int64_t j = 0; j < L; ++j) {
      if (!out.valid[j]) continue;
      out.kl += out.p[j] * (std::log(out.p[j] + kMaxTextEps) -
                            std::log(out.q[j] + kMaxTextEps));
      g[j] = -out.p[j] / (out.q[j] + kMaxTextEps);
      qg += out.q[j] * g[j];
    }
    for (int64_t j = 0; j < L; ++j) {
      if (out.valid[j]) out.dkl[j] = out.q[j] * (g[j] - qg);
    }
  }

  // Diagnostics.
  for (int64_t j = 0; j < L; ++j) {
    if (!out.valid[j]) continue;
    if (out.p[j] > 0) out.entropy_p -= out.p[j] * std::log(out.p[j]);
    if (out.q[j] > 0) out.entropy_q -= out.q[j] * log_q[j];
  }
  if (pr.recall_k > 0) {
    std::vector<int64_t> order;
    for (int64_t j = 0; j < L; ++j) {
      if (out.valid[j]) order.push_back(j);
    }
    // Highest score first, ties to the lower key (the slot's key in the
    // sparse stage, as the spec's top-k selection breaks them).
    const auto key = [&](int64_t j) {
      return pr.sparse() ? pr.topk[r * pr.K + j] : j;
    };
    std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
      return scores[i] > scores[j] ||
             (scores[i] == scores[j] && key(i) < key(j));
    });
    const int64_t k = std::min<int64_t>(pr.recall_k, num_valid);
    for (int64_t i = 0; i < k; ++i) out.recall += out.p[order[i]];
    out.recall_tie = k < num_valid && scores[order[k - 1]] == scores[order[k]];
  }
  return "";
}

}  // namespace

RefResult ComputeReference(const RefProblem& pr) {
  RefResult result;
  const int64_t rows = pr.B * pr.T;
  const int64_t L = pr.slots();
  result.row_kl.assign(rows, 0.0);
  result.grad.assign(rows * L, 0.0);
  result.p.assign(rows * L, 0.0);
  result.q.assign(rows * L, 0.0);
  result.valid.assign(rows * L, 0);
  result.row_counted.assign(rows, 0);

  double kl_sum = 0, entropy_p_sum = 0, entropy_q_sum = 0, recall_sum = 0;
  int64_t rows_computed = 0;
  RowOutcome row;
  for (int64_t b = 0; b < pr.B; ++b) {
    for (int64_t t = 0; t < pr.T; ++t) {
      const int64_t r = b * pr.T + t;
      std::string error = ComputeRow(pr, b, t, row);
      if (!error.empty()) {
        RefResult failed;
        failed.error = std::move(error);
        return failed;
      }
      std::copy(row.valid.begin(), row.valid.end(),
                result.valid.begin() + r * L);
      switch (row.kind) {
        case RowOutcome::Kind::kFullyMasked:
          ++result.rows_fully_masked;
          continue;
        case RowOutcome::Kind::kZeroTarget:
          ++result.rows_zero_target;
          continue;
        case RowOutcome::Kind::kComputed:
          break;
      }
      ++rows_computed;
      std::copy(row.p.begin(), row.p.end(), result.p.begin() + r * L);
      std::copy(row.q.begin(), row.q.end(), result.q.begin() + r * L);
      if (!pr.row_valid.empty() && pr.row_valid[r] == 0) continue;
      ++result.rows_counted;
      result.row_counted[r] = 1;
      result.row_kl[r] = row.kl;
      kl_sum += row.kl;
      entropy_p_sum += row.entropy_p;
      entropy_q_sum += row.entropy_q;
      recall_sum += row.recall;
      if (row.recall_tie) {
        result.recall_tie = true;
        if (pr.sparse()) result.recall_tie_sparse = true;
      }
      std::copy(row.dkl.begin(), row.dkl.end(), result.grad.begin() + r * L);
    }
  }

  switch (pr.reduction) {
    case RefReduction::kMean:
      result.denominator = rows;
      break;
    case RefReduction::kMeanValid:
      if (!pr.row_valid.empty()) {
        result.denominator =
            std::count_if(pr.row_valid.begin(), pr.row_valid.end(),
                          [](uint8_t v) { return v != 0; });
      } else {
        result.denominator = rows_computed;
      }
      break;
    case RefReduction::kSum:
      result.denominator = 1;
      break;
  }

  const double n = static_cast<double>(result.denominator);
  const double scale =
      result.denominator > 0 ? pr.scaling_factor / n * pr.grad_scale : 0.0;
  result.unscaled_loss = result.denominator > 0 ? kl_sum / n : 0.0;
  result.loss = pr.scaling_factor * result.unscaled_loss;
  for (double& g : result.grad) g *= scale;

  if (result.rows_counted > 0) {
    const double counted = static_cast<double>(result.rows_counted);
    result.mean_entropy_p = entropy_p_sum / counted;
    result.mean_entropy_q = entropy_q_sum / counted;
    result.topk_recall = recall_sum / counted;
  }
  return result;
}

double ReferenceLoss(const RefProblem& problem) {
  const RefResult result = ComputeReference(problem);
  if (!result.error.empty()) return std::numeric_limits<double>::quiet_NaN();
  return result.loss;
}

double DecodeBFloat16(uint16_t bits) { return Decode(bits, kBFloat16); }
double DecodeFloat16(uint16_t bits) { return Decode(bits, kFloat16); }
uint16_t EncodeBFloat16(double value) { return Encode(value, kBFloat16); }
uint16_t EncodeFloat16(double value) { return Encode(value, kFloat16); }
double RoundToBFloat16(double value) { return Round(value, kBFloat16); }
double RoundToFloat16(double value) { return Round(value, kFloat16); }

}  // namespace klref
