#ifndef KLSERVE_SERVER_SERVICE_LIMITS_H_
#define KLSERVE_SERVER_SERVICE_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"
#include "server/service/server_options.h"

namespace klserve::server {

// RESOURCE_EXHAUSTED when a tensor of `bytes` is over --max_tensor_bytes.
absl::Status CheckTensorBytes(absl::string_view field, int64_t bytes,
                              const ServerOptions& options);

// Every tensor a whole request carries, against --max_tensor_bytes.
absl::Status CheckInputBytes(const IndexerKlInputs& inputs,
                             const ServerOptions& options);
absl::Status CheckInputBytes(const ProjectionsInputs& inputs,
                             const ServerOptions& options);

// The outputs of `rows` rows of `problem` (gradient and row KL) against the
// tensor limit and, for a response that carries them in one message
// (`one_message`), the message limit. Checked before allocating them.
absl::Status CheckOutputBytes(const IndexerKlProblem& problem, int64_t rows,
                              bool one_message, const ServerOptions& options);

// Each output of a projections problem (the three gradients, the service's
// top-k selection, row KL) against the tensor limit and, for a response
// that carries them in one message (`one_message`), their sum against the
// message limit, named for the largest: before allocating them. The
// encoded response is weighed once allocated (CheckMessageBytes).
absl::Status CheckOutputBytes(const ProjectionsProblem& problem,
                              bool one_message, const ServerOptions& options);

// RESOURCE_EXHAUSTED naming `field` when a message that encodes to
// `encoded_bytes` (gRPC's count: the protobuf encoding, framing included) is
// over --max_message_bytes; `remedy` says what the caller can do instead.
absl::Status CheckMessageBytes(absl::string_view field, int64_t encoded_bytes,
                               absl::string_view remedy,
                               const ServerOptions& options);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LIMITS_H_
