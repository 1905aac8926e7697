#include "server/service/limits.h"

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

absl::Status CheckInputBytes(const IndexerKlInputs& in,
                             const ServerOptions& options) {
  for (const RequestTensor& tensor : kRequestTensors) {
    const TensorView* view = FindInput(in, tensor);
    if (view == nullptr) continue;
    RETURN_IF_ERROR(CheckTensorBytes(tensor.name, view->byte_size, options));
  }
  return absl::OkStatus();
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
