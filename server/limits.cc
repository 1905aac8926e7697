#include "server/limits.h"

#include "absl/strings/str_cat.h"

namespace klserve::server {

absl::Status CheckTensorBytes(absl::string_view field, int64_t bytes,
                              const ServerOptions& options) {
  if (bytes <= options.max_tensor_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field, ": ", bytes, " bytes is over the limit of ",
                   options.max_tensor_bytes, " (--max_tensor_bytes)"));
}

absl::Status CheckInputBytes(const IndexerKlInputs& in,
                             const ServerOptions& options) {
  const std::pair<const char*, const std::optional<TensorView>*> optional[] = {
      {"attention_logits", &in.attention_logits},
      {"attention_weights", &in.attention_weights},
      {"topk_indices", &in.topk_indices},
      {"segment_ids_q", &in.segment_ids_q},
      {"segment_ids_kv", &in.segment_ids_kv},
      {"attention_mask", &in.attention_mask},
      {"key_padding_mask", &in.key_padding_mask},
      {"row_valid", &in.row_valid}};
  for (const auto& [field, view] : optional) {
    if (!view->has_value()) continue;
    if (absl::Status s = CheckTensorBytes(field, (*view)->byte_size, options);
        !s.ok()) {
      return s;
    }
  }
  return CheckTensorBytes("indexer_scores", in.indexer_scores.byte_size,
                          options);
}

absl::Status CheckOutputBytes(const IndexerKlProblem& p, int64_t rows,
                              bool one_message, const ServerOptions& options) {
  const int64_t grad_bytes =
      p.options.want_grad
          ? rows * p.row_length * DTypeSize(p.options.grad_dtype)
          : 0;
  if (absl::Status s = CheckTensorBytes("grad", grad_bytes, options); !s.ok()) {
    return s;
  }
  const int64_t row_kl_bytes =
      p.options.want_row_kl ? rows * int64_t{sizeof(double)} : 0;
  if (one_message && grad_bytes + row_kl_bytes > options.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "grad: the response would carry ", grad_bytes + row_kl_bytes,
        " bytes, over the message limit of ", options.max_message_bytes,
        " (--max_message_bytes); send the problem with ComputeLossStream"));
  }
  return absl::OkStatus();
}

absl::Status CheckMessageBytes(absl::string_view field, int64_t encoded_bytes,
                               absl::string_view remedy,
                               const ServerOptions& options) {
  if (encoded_bytes <= options.max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      field, ": the response would encode to ", encoded_bytes,
      " bytes, over the message limit of ", options.max_message_bytes,
      " (--max_message_bytes); ", remedy));
}

}  // namespace klserve::server
