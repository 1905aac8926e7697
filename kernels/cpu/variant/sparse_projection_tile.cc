// The projections form's sparse tile: each row's K slots, the keys gathered
// row by row (the client's indices, or the service's own selection).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/variant/projection_tile.h"
#include "kernels/cpu/variant/projection_tile_parts.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

// The service's selection for the tile's rows into `indices` ([n, K]): the
// K valid keys with the highest scores, ties to the lower key, in ascending
// key order, then -1.
absl::Status SelectTopk(const ProjectionsProblem& p,
                        const ProjectionsRowData& rows,
                        const ProjectionTile& tile, const TileInputs& in,
                        ProjectionSteps& steps, int32_t* indices,
                        RowScratch& scratch, int64_t& failed_row) {
  const IndexerKlProblem& dense = *p.selection;
  const int64_t n = tile.t_end - tile.t_begin;
  const int64_t r0 = tile.b * p.T + tile.t_begin;
  RowData data;
  data.mask = rows.mask;
  TileValidity tv;
  if (absl::Status s = tv.Build(dense, data, r0, n, scratch, failed_row);
      !s.ok()) {
    return s;
  }
  int64_t hi = 0;
  for (const RowValidity& v : tv.rows) hi = std::max(hi, v.limit);
  std::vector<float> scores(n * p.S), u(n * p.H_I * KeyTileWidth(p.S));
  std::vector<float> index_key_buffer;
  for (int64_t s0 = 0; s0 < hi; s0 += kKeyTile) {
    const int64_t s1 = std::min(s0 + kKeyTile, hi), sk = s1 - s0;
    steps.GemmNT(n * p.H_I, sk, p.D_I, 1.0f, in.index_query, p.D_I,
                 Floats(p.index_key, (tile.b * p.S + s0) * p.D_I, sk * p.D_I,
                        index_key_buffer),
                 p.D_I, 0.0f, u.data(), sk);
    if (steps.stopped()) return steps.status();
    for (int64_t i = 0; i < n; ++i) {
      IndexerScores(u.data() + i * p.H_I * sk, sk,
                    in.weights.data() + i * p.H_I, p.H_I, sk, p.use_relu,
                    scores.data() + i * p.S + s0);
    }
  }
  std::vector<std::pair<float, int32_t>> ranked;
  for (int64_t i = 0; i < n; ++i) {
    if (!steps.Go()) return steps.status();  // ranks S keys a row
    const RowValidity& v = tv.rows[i];
    const float* I = scores.data() + i * p.S;
    ranked.clear();
    for (int64_t s = 0; s < v.limit; ++s) {
      if (!IsValidSlot(v, s)) continue;
      if (!std::isfinite(I[s])) {
        failed_row = r0 + i;
        return IndexerScoreOverflowError(tile.b, tile.t_begin + i, s, I[s]);
      }
      ranked.emplace_back(I[s], static_cast<int32_t>(s));
    }
    const int64_t k = std::min<int64_t>(p.K, ranked.size());
    const auto higher = [](const std::pair<float, int32_t>& a,
                           const std::pair<float, int32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::nth_element(ranked.begin(), ranked.begin() + k, ranked.end(), higher);
    int32_t* row = indices + i * p.K;
    for (int64_t j = 0; j < k; ++j) row[j] = ranked[j].second;
    // A comparator of this namespace's own: the sort is then instantiated
    // inside the variant, never as a library function that another
    // variant's copy could stand in for (scripts/check_isa_isolation.py).
    std::sort(row, row + k, [](int32_t a, int32_t b) { return a < b; });
    std::fill(row + k, row + p.K, -1);
  }
  return absl::OkStatus();
}

class SparseTile : private TileBase {
 public:
  using TileBase::Finish;
  using TileBase::TileBase;

  absl::Status Compute(int64_t& failed_row) {
    RowData data;
    std::vector<int32_t> selected;
    if (p_.server_topk) {
      selected.resize(n_ * p_.K);
      RowScratch& wide = RowScratch::ForThisThread(*p_.selection);
      if (absl::Status s = SelectTopk(p_, data_, tile_, in_, steps_,
                                      selected.data(), wide, failed_row);
          !s.ok()) {
        return s;
      }
      if (out_.topk_indices != nullptr) {
        std::copy(selected.begin(), selected.end(),
                  out_.topk_indices + (r0_ - out_.origin_row) * p_.K);
      }
      data.indices =
          RowView{.dtype = DType::kInt32,
                  .data = reinterpret_cast<const std::byte*>(selected.data()),
                  .origin_row = r0_,
                  .batch_stride = p_.T * p_.K,
                  .row_stride = p_.K};
    } else {
      data.indices = data_.indices;
    }
    data.mask = data_.mask;
    RowScratch& rows = RowScratch::ForThisThread(lp_);
    if (absl::Status s = tv_.Build(lp_, data, r0_, n_, rows, failed_row);
        !s.ok()) {
      return s;
    }
    const int64_t K = p_.K;
    keys_.resize(n_ * K);
    w_.assign(n_ * K, 0.0f);
    I_.assign(n_ * K, 0.0f);
    u_.resize(n_ * p_.H_I * K);
    gathered_index_keys_.resize(n_ * K * p_.D_I);
    for (int64_t i = 0; i < n_; ++i) {
      if (!steps_.Go()) return steps_.status();
      if (absl::Status s = RowTargetAndScores(i, data, failed_row); !s.ok()) {
        return s;
      }
    }
    if (tile_.want_grad) g_.assign(n_ * K, 0.0f);
    if (absl::Status s =
            TileRowLosses(lp_, tile_, tv_, w_.data(), I_.data(), g_.data(),
                          out_.results, rows, failed_row);
        !s.ok()) {
      return s;
    }
    if (tile_.want_grad) Gradients();
    return absl::OkStatus();
  }

 private:
  // Row i's valid slots' keys (compact, in slot order) into keys_, their
  // number into count_[i]; w and I of its slots.
  absl::Status RowTargetAndScores(int64_t i, const RowData& data,
                                  int64_t& failed_row) {
    const int64_t K = p_.K;
    const RowValidity& v = tv_.rows[i];
    const int64_t r = r0_ + i;
    const std::byte* indices = data.indices.Row(r, p_.T);
    int32_t* keys = keys_.data() + i * K;
    int64_t nv = 0;
    for (int64_t j = 0; j < K; ++j) {
      if (IsValidSlot(v, j)) {
        std::memcpy(&keys[nv++], indices + 4 * j, sizeof(int32_t));
      }
    }
    counts_.push_back(nv);
    if (nv == 0) return absl::OkStatus();
    const int64_t gs = p_.H / p_.H_kv;
    const int64_t t = tile_.t_begin + i;
    std::vector<float>& gathered = gather_buffer_;
    gathered.resize(nv * p_.D);
    std::vector<float>& logits = logits_buffer_;
    logits.resize(gs * nv);
    std::vector<float>& head_w = head_w_buffer_;
    head_w.assign(nv, 0.0f);
    std::vector<double>& head_sums = head_sums_buffer_;
    if (p_.H > kHeadsPerFloatSum) head_sums.resize(nv);
    for (int64_t g = 0; g < p_.H_kv; ++g) {
      for (int64_t x = 0; x < nv; ++x) {
        CopyFloats(p_.key, ((tile_.b * p_.S + keys[x]) * p_.H_kv + g) * p_.D,
                   p_.D, gathered.data() + x * p_.D);
      }
      steps_.GemmNT(gs, nv, p_.D, lp_.options.softmax_scale,
                    in_.query + (i * p_.H + g * gs) * p_.D, p_.D,
                    gathered.data(), p_.D, 0.0f, logits.data(), nv);
      if (steps_.stopped()) return steps_.status();
      for (int64_t y = 0; y < gs; ++y) {
        const int64_t h = g * gs + y;
        float* a = logits.data() + y * nv;
        // -inf is probability 0, as in the logits form.
        float m = -kInf;
        for (int64_t x = 0; x < nv; ++x) {
          if (!(a[x] < kInf)) {
            failed_row = r;
            return OverflowError("query, key: the main logit", tile_.b, t, h,
                                 keys[x], a[x]);
          }
          m = std::max(m, a[x]);
        }
        float shift = m;
        if (p_.has_lse) {
          std::memcpy(&shift, data_.lse.Row(r, p_.T, h), sizeof(float));
        } else if (m == -kInf) {
          failed_row = r;
          return AllLogitsMinusInfError(tile_.b, t, h);
        }
        // The kernels' exp, in place: libm's expf is chosen by CPU at run
        // time (an FMA version where there is FMA), so it could give other
        // bits on another replica.
        // The exps carry 2^kSoftmaxHeadroom; inv takes it back out.
        double mass = std::numeric_limits<double>::infinity();
        if (!MassBeyondExpDomain(m, shift)) {
          NoExtra none;
          mass = WithoutSoftmaxHeadroom(ExpRow<false, kSoftmaxHeadroom>(
              a, nv, nullptr, shift, 1.0f, a, none));
        }
        if (p_.has_lse) {
          absl::Status s = CheckLseMass(mass, tile_.b, t, h, "slots");
          if (!s.ok()) {
            failed_row = r;
            return s;
          }
        }
        const float inv = static_cast<float>(
            WithoutSoftmaxHeadroom(p_.has_lse ? 1.0 : 1.0 / mass));
        if (h % kHeadsPerFloatSum == 0 && h > 0) {  // a block of heads ended
          FoldHeadBlock(head_w.data(), head_sums.data(), nv,
                        /*first=*/h == kHeadsPerFloatSum);
        }
        for (int64_t x = 0; x < nv; ++x) head_w[x] += a[x] * inv;
      }
    }
    if (p_.H > kHeadsPerFloatSum) {
      FinishHeadSums(head_w.data(), head_sums.data(), nv);
    }
    float* index_keys = gathered_index_keys_.data() + i * K * p_.D_I;
    for (int64_t x = 0; x < nv; ++x) {
      CopyFloats(p_.index_key, (tile_.b * p_.S + keys[x]) * p_.D_I, p_.D_I,
                 index_keys + x * p_.D_I);
    }
    float* u = u_.data() + i * p_.H_I * K;
    steps_.GemmNT(p_.H_I, nv, p_.D_I, 1.0f,
                  in_.index_query + i * p_.H_I * p_.D_I, p_.D_I, index_keys,
                  p_.D_I, 0.0f, u, nv);
    if (steps_.stopped()) return steps_.status();
    std::vector<float>& scores = scores_buffer_;
    scores.resize(nv);
    IndexerScores(u, nv, in_.weights.data() + i * p_.H_I, p_.H_I, nv,
                  p_.use_relu, scores.data());
    // Back to the row's slots.
    float* w = w_.data() + i * K;
    float* I = I_.data() + i * K;
    for (int64_t j = 0, x = 0; j < K; ++j) {
      if (!IsValidSlot(v, j)) continue;
      if (!std::isfinite(scores[x])) {
        failed_row = r;
        return IndexerScoreOverflowError(tile_.b, t, keys[x], scores[x]);
      }
      w[j] = head_w[x];
      I[j] = scores[x];
      ++x;
    }
    return absl::OkStatus();
  }

  void Gradients() {
    const int64_t K = p_.K;
    // Value-initialised (zeros), not (n, 0.0): see dense_projection_tile.cc.
    std::vector<float> dq(n_ * p_.H_I * p_.D_I);
    std::vector<double> dw(n_ * p_.H_I);
    KeyGradPartial& dk = *out_.key_grad;
    int64_t total = 0;
    for (int64_t c : counts_) total += c;
    dk.count = total;
    dk.rows.resize(total * p_.D_I);
    dk.keys.resize(total);
    std::vector<float> g(K), e(p_.H_I * K);
    int64_t at = 0;
    for (int64_t i = 0; i < n_; ++i) {
      if (!steps_.Go()) return;  // Finish reports the stop
      const int64_t nv = counts_[i];
      if (nv == 0) continue;
      const RowValidity& v = tv_.rows[i];
      const float* row_g = g_.data() + i * K;
      for (int64_t j = 0, x = 0; j < K; ++j) {
        if (IsValidSlot(v, j)) g[x++] = row_g[j];
      }
      const float* u = u_.data() + i * p_.H_I * K;
      IndexerGrads(u, nv, in_.weights.data() + i * p_.H_I, p_.H_I, nv,
                   p_.use_relu, g.data(), e.data(), dw.data() + i * p_.H_I);
      const float* index_keys = gathered_index_keys_.data() + i * K * p_.D_I;
      steps_.GemmNN(p_.H_I, p_.D_I, nv, e.data(), nv, index_keys, p_.D_I, 0.0f,
                    dq.data() + i * p_.H_I * p_.D_I, p_.D_I);
      steps_.GemmTN(nv, p_.D_I, p_.H_I, e.data(), nv,
                    in_.index_query + i * p_.H_I * p_.D_I, p_.D_I,
                    dk.rows.data() + at * p_.D_I, p_.D_I);
      std::copy(keys_.data() + i * K, keys_.data() + i * K + nv,
                dk.keys.data() + at);
      at += nv;
    }
    // A stopped tile's sums are partial: nothing of them goes out.
    if (steps_.stopped()) return;
    StoreQueryGrads(p_, tile_, out_, dq.data(), dw.data());
  }

  std::vector<int32_t> keys_;     // [n, K]: each row's valid slots' keys
  std::vector<int64_t> counts_;   // valid slots per row
  std::vector<float> w_, I_, g_;  // [n, K]
  std::vector<float> u_;          // [n, H_I, K] (row i: [H_I, count])
  std::vector<float> gathered_index_keys_;  // [n, K, D_I]
  // One row's buffers, reused by every row.
  std::vector<float> gather_buffer_, logits_buffer_, head_w_buffer_,
      scores_buffer_;
  std::vector<double> head_sums_buffer_;  // past kHeadsPerFloatSum heads
};

}  // namespace

absl::Status ComputeSparseProjectionTile(const ProjectionsProblem& problem,
                                         const ProjectionsRowData& data,
                                         const ProjectionTile& tile,
                                         const ProjectionTileOutputs& outputs,
                                         int64_t& failed_row) {
  SparseTile sparse(problem, data, tile, outputs);
  return sparse.Finish(sparse.Compute(failed_row), failed_row);
}

}  // namespace klserve::cpu::KLSERVE_ISA
