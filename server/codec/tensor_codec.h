#ifndef KLSERVE_SERVER_CODEC_TENSOR_CODEC_H_
#define KLSERVE_SERVER_CODEC_TENSOR_CODEC_H_

// Translation between the wire messages and the kernels' types. Views point
// into the messages' bytes (or the shared-memory regions they name), never
// copies: the server keeps each request message alive until the
// computation that reads it has finished (for a stream, until the block's
// gradient has been produced).

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "kernels/projections_problem.h"
#include "kernels/row_block.h"
#include "klserve/v1/klserve.pb.h"
#include "server/codec/call_regions.h"

namespace klserve::server {

// A view of tensor.data(); `tensor` must outlive every use of the view.
// With `regions`, a tensor may instead name a slice of a shared-memory
// region (Tensor.region), viewed in place, or copied into `regions` for
// INT32 and BOOL tensors; without, such a tensor is INVALID_ARGUMENT.
absl::StatusOr<TensorView> ViewOf(absl::string_view field,
                                  const v1::Tensor& tensor,
                                  CallRegions* regions = nullptr);

// The options of a logits-form request: INVALID_ARGUMENT naming an option
// of the projections form (index_weight_scale, use_relu, topk) set.
absl::StatusOr<IndexerKlOptions> OptionsFrom(const v1::LossOptions& options);

// The options of a projections-form request.
absl::StatusOr<ProjectionsOptions> ProjectionsOptionsFrom(
    const v1::LossOptions& options);

// The inputs of a whole problem in the logits form (FormOf), viewing the
// request's bytes. INVALID_ARGUMENT naming the first tensor of the
// projections form the request carries.
absl::StatusOr<IndexerKlInputs> InputsFrom(
    const v1::ComputeLossRequest& request, CallRegions& regions);

// The inputs of a whole problem in the projections form (FormOf), viewing
// the request's bytes. INVALID_ARGUMENT naming the first tensor of the
// logits forms the request carries (attention_logits, attention_weights,
// indexer_scores).
absl::StatusOr<ProjectionsInputs> ProjectionsInputsFrom(
    const v1::ComputeLossRequest& request, CallRegions& regions);

// The inputs of a streamed problem: per-row tensors give dtype and shape
// only (their bytes come in blocks); the small tensors view the header's
// bytes.
absl::StatusOr<IndexerKlInputs> InputsFrom(const v1::StreamHeader& header);

// The same for a streamed problem of the projections form (FormOf): the
// query side gives dtype and shape only; the key side and the small
// tensors view the header's bytes.
absl::StatusOr<ProjectionsInputs> ProjectionsInputsFrom(
    const v1::StreamHeader& header);

// A block's bytes, viewed in place. The projections form's are each of its
// per-row tensors (ProjectionsRowTensors, which `problem` gives, names them),
// those `problem` has not too, which must then be empty.
RowBlockBytes BlockBytesOf(const v1::RowBlock& block);
ProjectionsBlockBytes ProjectionsBlockBytesOf(const ProjectionsProblem& problem,
                                              const v1::RowBlock& block);

void ResultTo(const IndexerKlResult& result, v1::LossResult* out);

// Sets `out` to a result each of whose fields takes the most bytes it can,
// diagnostics included: a message holding it encodes to at least as many
// bytes as it will once ResultTo has set the real one. For checking a
// response against the message limit before computing it.
void WidestResultTo(v1::LossResult* out);

// Sets `out` to a tensor of `dtype` and `shape` and returns its bytes, to be
// filled by the caller.
std::byte* AllocateTensor(DType dtype, absl::Span<const int64_t> shape,
                          v1::Tensor* out);

// The same for an FP64 tensor (row_kl; FP64 is an output-only dtype).
double* AllocateFloat64Tensor(absl::Span<const int64_t> shape, v1::Tensor* out);

// The same for a dtype named on the wire, of `element_size` bytes.
std::byte* AllocateTensor(absl::string_view dtype_name, int64_t element_size,
                          absl::Span<const int64_t> shape, v1::Tensor* out);

// Sets the output `field` of `response` (grad, row_kl, d_index_query,
// d_index_key, d_index_weights or topk_indices: the outputs a request may
// direct into a region, ComputeLossRequest.outputs) to a tensor of the wire
// dtype `dtype_name`, `element_size` bytes an element, and of `shape`, and
// returns where its bytes go: into the response, as AllocateTensor, or into
// the region slice request.outputs gives it, which must be exactly the
// output's bytes (INVALID_ARGUMENT naming outputs.<field> otherwise); the
// response's tensor then carries the slice instead of data. The outputs'
// bytes must have been weighed (CheckOutputsFit).
absl::StatusOr<std::byte*> PlaceOutput(
    absl::string_view field, absl::string_view dtype_name, int64_t element_size,
    absl::Span<const int64_t> shape, const v1::ComputeLossRequest& request,
    CallRegions& regions, v1::ComputeLossResponse& response);
// The same in `dtype`.
absl::StatusOr<std::byte*> PlaceOutput(absl::string_view field, DType dtype,
                                       absl::Span<const int64_t> shape,
                                       const v1::ComputeLossRequest& request,
                                       CallRegions& regions,
                                       v1::ComputeLossResponse& response);
// The same for row_kl, FP64 [B, T].
absl::StatusOr<double*> PlaceRowKl(absl::Span<const int64_t> shape,
                                   const v1::ComputeLossRequest& request,
                                   CallRegions& regions,
                                   v1::ComputeLossResponse& response);

// INVALID_ARGUMENT naming the first slice of request.outputs for an output
// `response` does not carry: a slice the client would wait on in vain.
absl::Status CheckOutputsProduced(const v1::ComputeLossRequest& request,
                                  const v1::ComputeLossResponse& response);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_CODEC_TENSOR_CODEC_H_
