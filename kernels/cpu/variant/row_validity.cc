#include "kernels/cpu/variant/row_validity.h"

#include <algorithm>
#include <cstring>

#include "kernels/row_rules.h"
#include "kernels/topk_check.h"

namespace klserve::cpu::KLSERVE_ISA {
namespace {

// Not kernels/tensor_checks.h's: an inline function of namespace klserve
// built in this variant's instruction set could stand for every caller's
// (isa_namespace.h).
int32_t LoadInt32(const std::byte* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Per-key rules of row (b, t) other than causality, for key s.
struct KeyRules {
  const std::byte* segment_kv = nullptr;  // row b of segment_ids_kv
  int32_t segment_q = 0;
  const std::byte* key_padding = nullptr;  // row b of key_padding_mask
  const std::byte* mask = nullptr;         // row (b, t) of attention_mask

  bool Allows(int64_t s) const {
    if (segment_kv != nullptr) {
      const int32_t id = LoadInt32(segment_kv + 4 * s);
      if (id < 0 || id != segment_q) return false;
    }
    if (key_padding != nullptr && key_padding[s] == std::byte{0}) return false;
    if (mask != nullptr && mask[s] == std::byte{0}) return false;
    return true;
  }
};

KeyRules RulesOf(const IndexerKlProblem& p, const RowData& data, int64_t r) {
  const int64_t b = r / p.T, t = r % p.T;
  KeyRules rules;
  if (p.segment_ids_q != nullptr) {
    rules.segment_q = LoadInt32(p.segment_ids_q + 4 * (b * p.T + t));
    rules.segment_kv = p.segment_ids_kv + 4 * b * p.S;
  }
  if (p.key_padding_mask != nullptr) {
    rules.key_padding = p.key_padding_mask + b * p.S;
  }
  if (data.mask.present()) rules.mask = data.mask.Row(r, p.T);
  return rules;
}

}  // namespace

absl::StatusOr<RowValidity> BuildRowValidity(const IndexerKlProblem& p,
                                             const RowData& data, int64_t r,
                                             RowScratch& scratch) {
  const int64_t t = r % p.T;
  // Keys in [start, end) pass the causal cut and the key bounds.
  int64_t start = 0;
  int64_t end = CausalEnd(p.options.causal, t, p.q_offset, p.S);
  if (p.key_start != nullptr) {
    start = LoadInt32(p.key_start + 4 * r);
    // key_end may be below 0 (a row without keys): the loops below take
    // end as a length.
    end = std::clamp<int64_t>(LoadInt32(p.key_end + 4 * r), 0, end);
  }
  const KeyRules rules = RulesOf(p, data, r);
  uint8_t* bytes = scratch.valid();
  RowValidity validity;

  if (!p.sparse()) {
    validity.limit = end;
    if (!p.has_row_mask() && start == 0) {
      validity.count = end;
      return validity;
    }
    // One simple loop per rule, so that each vectorises.
    std::memset(bytes, 0, std::clamp<int64_t>(start, 0, end));
    if (start < end) std::memset(bytes + start, 1, end - start);
    if (rules.segment_kv != nullptr) {
      for (int64_t s = 0; s < end; ++s) {
        const int32_t id = LoadInt32(rules.segment_kv + 4 * s);
        bytes[s] &= (id >= 0) & (id == rules.segment_q);
      }
    }
    if (rules.key_padding != nullptr) {
      for (int64_t s = 0; s < end; ++s) {
        bytes[s] &= rules.key_padding[s] != std::byte{0};
      }
    }
    if (rules.mask != nullptr) {
      for (int64_t s = 0; s < end; ++s) {
        bytes[s] &= rules.mask[s] != std::byte{0};
      }
    }
    int64_t count = 0;
    for (int64_t s = 0; s < end; ++s) count += bytes[s];
    validity.bytes = bytes;
    validity.count = count;
    return validity;
  }

  // The index rule (no key twice) first, shared with the other backends;
  // then the causal cut, which also empties the slots of indices outside
  // [0, S) (start >= 0, end <= S), and the other rules gathered by key.
  const std::byte* indices = data.indices.Row(r, p.T);
  const absl::Status indices_ok =
      CheckTopkRow(indices, p.row_length, p.S, r / p.T, t, scratch.row_keys());
  if (!indices_ok.ok()) return indices_ok;
  // In int32 and in locals, so that the loop vectorises (the byte stores
  // could otherwise alias p.row_length). end <= S < 2^31, and key_start is
  // an int32.
  const int64_t K = p.row_length;
  const int32_t first = static_cast<int32_t>(start);
  const int32_t stop = static_cast<int32_t>(end);
  for (int64_t j = 0; j < K; ++j) {
    const int32_t key = LoadInt32(indices + 4 * j);
    bytes[j] = (key >= first) & (key < stop);
  }
  if (p.has_row_mask()) {
    for (int64_t j = 0; j < K; ++j) {
      if (bytes[j]) bytes[j] = rules.Allows(LoadInt32(indices + 4 * j));
    }
  }
  int64_t count = 0;
  for (int64_t j = 0; j < K; ++j) count += bytes[j];
  validity.limit = K;
  validity.bytes = bytes;
  validity.count = count;
  validity.keys = indices;
  return validity;
}

}  // namespace klserve::cpu::KLSERVE_ISA
