#include "server/service/limits.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"

namespace klserve::server {

absl::Status CheckTensorBytes(absl::string_view field, int64_t bytes,
                              const ServerOptions& options) {
  if (bytes <= options.max_tensor_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field, ": ", bytes, " bytes is over the limit of ",
                   options.max_tensor_bytes, " (--max_tensor_bytes)"));
}

namespace {

template <typename Inputs>
absl::Status CheckEveryInput(const Inputs& in, const ServerOptions& options) {
  for (const RequestTensor& tensor : kRequestTensors) {
    const TensorView* view = FindInput(in, tensor);
    if (view == nullptr) continue;
    RETURN_IF_ERROR(CheckTensorBytes(tensor.name, view->byte_size, options));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckInputBytes(const IndexerKlInputs& in,
                             const ServerOptions& options) {
  return CheckEveryInput(in, options);
}

absl::Status CheckInputBytes(const ProjectionsInputs& in,
                             const ServerOptions& options) {
  return CheckEveryInput(in, options);
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

absl::Status CheckOutputBytes(const ProjectionsProblem& p, bool one_message,
                              const ServerOptions& options) {
  const IndexerKlOptions& o = p.logits.options;
  const int64_t element = DTypeSize(o.grad_dtype);
  const struct {
    const char* field;
    int64_t bytes;
  } outputs[] = {
      {"d_index_query", o.want_grad ? p.B * p.T * p.H_I * p.D_I * element : 0},
      {"d_index_key", o.want_grad ? p.B * p.S * p.D_I * element : 0},
      {"d_index_weights", o.want_grad ? p.B * p.T * p.H_I * element : 0},
      {"topk_indices",
       p.server_topk ? p.B * p.T * p.K * int64_t{sizeof(int32_t)} : 0},
      {"row_kl", o.want_row_kl ? p.B * p.T * int64_t{sizeof(double)} : 0},
  };
  int64_t total = 0;
  const char* largest = outputs[0].field;
  int64_t largest_bytes = 0;
  for (const auto& output : outputs) {
    RETURN_IF_ERROR(CheckTensorBytes(output.field, output.bytes, options));
    // Within 64 bits unless the tensor limit is near them.
    if (__builtin_add_overflow(total, output.bytes, &total)) {
      total = std::numeric_limits<int64_t>::max();
    }
    if (output.bytes > largest_bytes) {
      largest = output.field;
      largest_bytes = output.bytes;
    }
  }
  if (one_message && total > options.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        largest, ": the response would carry ", total,
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
