#include "tests/reference/projections_reference.h"

#include <algorithm>
#include <cmath>

namespace klref {
namespace {

double Dot(const double* x, const double* y, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

double WeightScale(const RefProjections& p) {
  return p.index_weight_scale.value_or(
      1.0 / std::sqrt(static_cast<double>(p.H_I * p.D_I)));
}

// u[b,t,j,s] = index_query[b,t,j,:] . index_key[b,s,:]
double IndexerDot(const RefProjections& p, int64_t b, int64_t t, int64_t j,
                  int64_t s) {
  return Dot(&p.index_query[((b * p.T + t) * p.H_I + j) * p.D_I],
             &p.index_key[(b * p.S + s) * p.D_I], p.D_I);
}

double Activation(const RefProjections& p, double u) {
  return p.use_relu ? std::max(u, 0.0) : u;
}

// d Activation / du, with relu'(0) = 0.
double ActivationSlope(const RefProjections& p, double u) {
  return p.use_relu ? (u > 0 ? 1.0 : 0.0) : 1.0;
}

double IndexerScore(const RefProjections& p, int64_t b, int64_t t, int64_t s) {
  const double ws = WeightScale(p);
  double score = 0;
  for (int64_t j = 0; j < p.H_I; ++j) {
    score += ws * p.index_weights[(b * p.T + t) * p.H_I + j] *
             Activation(p, IndexerDot(p, b, t, j, s));
  }
  return score;
}

// The K valid keys of each row with the highest dense score, ties to the
// lower key; valid slots first in ascending key order, -1 after.
std::vector<int64_t> SelectTopK(const RefProjections& p) {
  const RefProblem scores = LogitsFormOf(p, {});
  const RefResult dense = ComputeReference(scores);
  std::vector<int64_t> topk(p.B * p.T * p.K, -1);
  if (!dense.error.empty()) return topk;
  for (int64_t r = 0; r < p.B * p.T; ++r) {
    std::vector<int64_t> keys;
    for (int64_t s = 0; s < p.S; ++s) {
      if (dense.valid[r * p.S + s]) keys.push_back(s);
    }
    std::stable_sort(keys.begin(), keys.end(), [&](int64_t x, int64_t y) {
      return scores.scores[r * p.S + x] > scores.scores[r * p.S + y];
    });
    keys.resize(std::min<size_t>(keys.size(), p.K));
    std::sort(keys.begin(), keys.end());
    std::copy(keys.begin(), keys.end(), topk.begin() + r * p.K);
  }
  return topk;
}

}  // namespace

RefProblem LogitsFormOf(const RefProjections& p,
                        const std::vector<int64_t>& topk) {
  RefProblem out = p.options;
  out.B = p.B;
  out.T = p.T;
  out.S = p.S;
  out.H = p.H;
  const bool sparse = !topk.empty();
  out.K = sparse ? p.K : 0;
  out.topk = sparse ? topk : std::vector<int64_t>{};
  const int64_t L = sparse ? p.K : p.S;
  out.logits.assign(p.B * p.H * p.T * L, 0.0);
  out.weights.clear();
  out.scores.assign(p.B * p.T * L, 0.0);
  const int64_t group = p.H / p.H_kv;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.T; ++t) {
      for (int64_t l = 0; l < L; ++l) {
        int64_t s = l;
        if (sparse) {
          s = topk[(b * p.T + t) * p.K + l];
          // An empty or out-of-range slot carries no value; the logits form
          // judges the index itself.
          if (s < 0 || s >= p.S) continue;
        }
        out.scores[(b * p.T + t) * L + l] = IndexerScore(p, b, t, s);
        for (int64_t h = 0; h < p.H; ++h) {
          // softmax_scale stays in the options: the logits form applies it.
          out.logits[((b * p.H + h) * p.T + t) * L + l] =
              Dot(&p.query[((b * p.T + t) * p.H + h) * p.D],
                  &p.key[((b * p.S + s) * p.H_kv + h / group) * p.D], p.D);
        }
      }
    }
  }
  return out;
}

RefProjectionsResult ComputeProjectionsReference(const RefProjections& p) {
  RefProjectionsResult result;
  std::vector<int64_t> topk;
  if (p.K > 0) {
    topk = p.topk_indices.empty() ? SelectTopK(p) : p.topk_indices;
    if (p.topk_indices.empty()) result.topk_indices = topk;
  }
  result.kl = ComputeReference(LogitsFormOf(p, topk));
  if (!result.kl.error.empty()) return result;

  const double ws = WeightScale(p);
  const int64_t L = p.K > 0 ? p.K : p.S;
  result.d_index_query.assign(p.index_query.size(), 0.0);
  result.d_index_key.assign(p.index_key.size(), 0.0);
  result.d_index_weights.assign(p.index_weights.size(), 0.0);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t t = 0; t < p.T; ++t) {
      const int64_t r = b * p.T + t;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t s = p.K > 0 ? topk[r * p.K + l] : l;
        const double g = result.kl.grad[r * L + l];
        if (s < 0 || g == 0) continue;
        for (int64_t j = 0; j < p.H_I; ++j) {
          const double u = IndexerDot(p, b, t, j, s);
          const double w_eff = ws * p.index_weights[r * p.H_I + j];
          result.d_index_weights[r * p.H_I + j] += ws * g * Activation(p, u);
          const double du = g * w_eff * ActivationSlope(p, u);
          for (int64_t d = 0; d < p.D_I; ++d) {
            result.d_index_query[(r * p.H_I + j) * p.D_I + d] +=
                du * p.index_key[(b * p.S + s) * p.D_I + d];
            result.d_index_key[(b * p.S + s) * p.D_I + d] +=
                du * p.index_query[(r * p.H_I + j) * p.D_I + d];
          }
        }
      }
    }
  }
  return result;
}

}  // namespace klref
