#ifndef KLSERVE_SERVER_SERVICE_LIMITS_H_
#define KLSERVE_SERVER_SERVICE_LIMITS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"
#include "klserve/v1/klserve.pb.h"
#include "server/service/server_options.h"

namespace klserve::server {

// RESOURCE_EXHAUSTED when a tensor of `bytes` is over --max_tensor_bytes;
// `why`, when given, ends the message.
absl::Status CheckTensorBytes(absl::string_view field, int64_t bytes,
                              const ServerOptions& options,
                              absl::string_view why = "");

// Every tensor a whole request carries, against --max_tensor_bytes.
absl::Status CheckInputBytes(const IndexerKlInputs& inputs,
                             const ServerOptions& options);
absl::Status CheckInputBytes(const ProjectionsInputs& inputs,
                             const ServerOptions& options);

// One output of a response: its field, its bytes (-1 when that size
// overflows 64 bits) and whether the message carries it (not when it is
// placed in a shared-memory region).
struct OutputBytes {
  const char* field;
  int64_t bytes;
  bool in_message;
  // What the caller can do when this output alone passes the message limit
  // (and is the largest part of a message too large); empty, or the output
  // within the limit: what the call's check says.
  absl::string_view remedy = {};

  // `remedy` when it applies under `max_message_bytes`, else `otherwise`.
  absl::string_view RemedyUnder(int64_t max_message_bytes,
                                absl::string_view otherwise) const {
    return !remedy.empty() && bytes > max_message_bytes ? remedy : otherwise;
  }
};

// The bytes of a tensor of `element_bytes` elements shaped `dims`; -1 when
// that overflows 64 bits.
int64_t OutputByteSize(int64_t element_bytes, absl::Span<const int64_t> dims);

// The output a message too large is blamed on: the largest the message
// carries (the first of equals); null when it carries none.
const OutputBytes* LargestInMessage(absl::Span<const OutputBytes> outputs);

// Checked before any output is allocated: each output against the tensor
// limit, and the sum of those the message carries against the message limit
// (RESOURCE_EXHAUSTED naming the largest; its remedy, or else `remedy`,
// says what the caller can do). The sum is a lower bound of the encoded
// message, which is weighed once allocated (CheckMessageBytes).
absl::Status CheckOutputsFit(absl::Span<const OutputBytes> outputs,
                             absl::string_view remedy,
                             const ServerOptions& options);

// The outputs of `rows` rows of `problem` (gradient and row KL), `placed`
// saying which go to regions (none in a stream).
std::vector<OutputBytes> OutputBytesOf(const IndexerKlProblem& problem,
                                       int64_t rows,
                                       const v1::OutputRegions& placed);
// CheckOutputsFit of those.
absl::Status CheckOutputBytes(const IndexerKlProblem& problem, int64_t rows,
                              const v1::OutputRegions& placed,
                              absl::string_view remedy,
                              const ServerOptions& options);

// At a stream's header: a block carries whole rows, so one row's tensors
// must fit the tensor and message limits, and so must its answer; else no
// block of `problem` could ever be sent (RESOURCE_EXHAUSTED naming the
// largest tensor).
absl::Status CheckOneRowFits(const IndexerKlProblem& problem,
                             const ServerOptions& options);

// The outputs of a whole projections problem: its per-row outputs over all
// B*T rows (ProjectionsRowOutputTensors), then d_index_key, with a remedy of
// its own (a stream's last message carries it whole too).
std::vector<OutputBytes> OutputBytesOf(const ProjectionsProblem& problem,
                                       const v1::OutputRegions& placed);

// CheckOutputsFit of the per-row outputs of `rows` rows of a projections
// `problem`: one GradBlock's.
absl::Status CheckRowOutputBytes(const ProjectionsProblem& problem,
                                 int64_t rows, absl::string_view remedy,
                                 const ServerOptions& options);

// RESOURCE_EXHAUSTED naming `key` when a projections-form call would hold
// more than --max_stream_key_bytes for its key side: the float64 sum of
// d_index_key (8 B S D_I bytes, 4 times a BF16 index_key) when the gradients
// are asked for, and for a stream, which holds them for its life, key and
// index_key too (a unary call's lie in its message or a region).
absl::Status CheckKeySideBytes(const ProjectionsProblem& problem, bool stream,
                               const ServerOptions& options);

// RESOURCE_EXHAUSTED naming indexer_scores when a compute thread of
// `backend` would hold more than --max_thread_scratch_bytes for one row of
// `problem` (on the CPU about 41 bytes a slot, from as few as 4 bytes of
// input a slot; the CUDA backend keeps no row scratch on the host).
absl::Status CheckThreadScratch(const IndexerKlProblem& problem,
                                const Backend& backend,
                                const ServerOptions& options);

// RESOURCE_EXHAUSTED naming the key side when a compute thread would hold
// more than --max_thread_scratch_bytes for one tile of `problem`.
absl::Status CheckThreadScratch(const ProjectionsProblem& problem,
                                const ServerOptions& options);

// RESOURCE_EXHAUSTED naming `field` when a message that encodes to
// `encoded_bytes` (gRPC's count: the protobuf encoding, framing included) is
// over --max_message_bytes; `remedy` says what the caller can do instead.
absl::Status CheckMessageBytes(absl::string_view field, int64_t encoded_bytes,
                               absl::string_view remedy,
                               const ServerOptions& options);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SERVICE_LIMITS_H_
