#include "server/service/limits.h"

#include <array>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message.h"
#include "kernels/cpu/row_scratch.h"
#include "kernels/projections_computation.h"
#include "kernels/row_block.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"
#include "proto/request_tensors.h"

namespace klserve::server {

absl::Status CheckTensorBytes(absl::string_view field, int64_t bytes,
                              const ServerOptions& options,
                              absl::string_view why) {
  if (bytes <= options.max_tensor_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field, ": ", bytes, " bytes is over the limit of ",
                   options.max_tensor_bytes, " (--max_tensor_bytes)",
                   why.empty() ? "" : "; ", why));
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

// Whether `placed` sends output `field` to a region, out of the message.
bool Placed(const v1::OutputRegions& placed, const char* field) {
  return placed.GetReflection()->HasField(
      placed, v1::OutputRegions::descriptor()->FindFieldByName(field));
}

// The bytes of the per-row outputs `p` asks for over rows of dimensions
// `rows`, in ProjectionsRowOutputTensors' order.
std::vector<OutputBytes> RowOutputBytes(const ProjectionsProblem& p,
                                        absl::Span<const int64_t> rows,
                                        const v1::OutputRegions& placed) {
  std::vector<OutputBytes> outputs;
  for (const ProjectionsRowOutputTensor& tensor :
       ProjectionsRowOutputTensors(p)) {
    outputs.push_back(
        {tensor.field,
         tensor.wanted ? OutputByteSize(tensor.row_bytes(), rows) : 0,
         !Placed(placed, tensor.field)});
  }
  return outputs;
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

const OutputBytes* LargestInMessage(absl::Span<const OutputBytes> outputs) {
  const OutputBytes* largest = nullptr;
  for (const OutputBytes& output : outputs) {
    if (!output.in_message || output.bytes <= 0) continue;
    if (largest == nullptr || output.bytes > largest->bytes) largest = &output;
  }
  return largest;
}

absl::Status CheckOutputsFit(absl::Span<const OutputBytes> outputs,
                             absl::string_view remedy,
                             const ServerOptions& options) {
  int64_t total = 0;
  for (const OutputBytes& output : outputs) {
    if (output.bytes < 0) {  // its size overflowed: past any limit
      return CheckTensorBytes(output.field, std::numeric_limits<int64_t>::max(),
                              options);
    }
    RETURN_IF_ERROR(CheckTensorBytes(output.field, output.bytes, options));
    if (!output.in_message) continue;
    // Each is within the tensor limit; their sum within 64 bits unless that
    // limit is near them.
    if (__builtin_add_overflow(total, output.bytes, &total)) {
      total = std::numeric_limits<int64_t>::max();
    }
  }
  if (total <= options.max_message_bytes) return absl::OkStatus();
  const OutputBytes& largest = *LargestInMessage(outputs);
  return absl::ResourceExhaustedError(
      absl::StrCat(largest.field, ": the response would carry at least ", total,
                   " bytes, over the message limit of ",
                   options.max_message_bytes, " (--max_message_bytes); ",
                   largest.RemedyUnder(options.max_message_bytes, remedy)));
}

int64_t OutputByteSize(int64_t element_bytes, absl::Span<const int64_t> dims) {
  return ShapeBytes(element_bytes, dims).value_or(-1);
}

std::vector<OutputBytes> OutputBytesOf(const IndexerKlProblem& p, int64_t rows,
                                       const v1::OutputRegions& placed) {
  const IndexerKlOptions& o = p.options;
  return {{"grad",
           o.want_grad
               ? OutputByteSize(DTypeSize(o.grad_dtype), {rows, p.row_length})
               : 0,
           !placed.has_grad()},
          {"row_kl", o.want_row_kl ? OutputByteSize(sizeof(double), {rows}) : 0,
           !placed.has_row_kl()}};
}

absl::Status CheckOutputBytes(const IndexerKlProblem& p, int64_t rows,
                              const v1::OutputRegions& placed,
                              absl::string_view remedy,
                              const ServerOptions& options) {
  return CheckOutputsFit(OutputBytesOf(p, rows, placed), remedy, options);
}

absl::Status CheckOneRowFits(const IndexerKlProblem& p,
                             const ServerOptions& options) {
  constexpr absl::string_view kWhy =
      "a block carries whole rows, so no block of this problem could be sent";
  using google::protobuf::io::CodedOutputStream;
  // The smallest block message, as gRPC weighs it (its protobuf encoding):
  // one row, with the last row's row_begin, the widest varint a block of
  // this problem needs.
  const int64_t last_row = p.num_rows() - 1;
  int64_t block = 2;                           // num_rows = 1
  if (!p.denominator.has_value()) block += 2;  // counting = true, first pass
  if (last_row > 0) {
    block +=
        1 + CodedOutputStream::VarintSize64(static_cast<uint64_t>(last_row));
  }
  const BlockTensor* largest = nullptr;
  const std::array<BlockTensor, 4> tensors = BlockTensorsOf(p);
  for (const BlockTensor& tensor : tensors) {
    if (!tensor.used) continue;
    const int64_t bytes = tensor.BytesOf(1);
    RETURN_IF_ERROR(CheckTensorBytes(absl::StrCat(tensor.field, " (one row)"),
                                     bytes, options, kWhy));
    block += 1 + CodedOutputStream::VarintSize64(static_cast<uint64_t>(bytes)) +
             bytes;
    if (largest == nullptr || bytes > largest->BytesOf(1)) largest = &tensor;
  }
  const int64_t message =
      1 + CodedOutputStream::VarintSize64(static_cast<uint64_t>(block)) + block;
  if (message > options.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        largest->field, ": a block of one row encodes to ", message,
        " bytes, over the message limit of ", options.max_message_bytes,
        " (--max_message_bytes); ", kWhy));
  }
  return CheckOutputBytes(p, 1, v1::OutputRegions::default_instance(), kWhy,
                          options);
}

std::vector<OutputBytes> OutputBytesOf(const ProjectionsProblem& p,
                                       const v1::OutputRegions& placed) {
  const IndexerKlOptions& o = p.logits.options;
  std::vector<OutputBytes> outputs = RowOutputBytes(p, {p.B, p.T}, placed);
  // Last: where it is as large as d_index_query, the error names the one
  // that a stream splits into blocks.
  outputs.push_back(
      {"d_index_key",
       o.want_grad
           ? OutputByteSize(DTypeSize(o.grad_dtype), p.key_gradient_shape())
           : 0,
       !Placed(placed, "d_index_key"),
       DTypeSize(o.grad_dtype) > 2
           ? "a stream's last message carries it whole too: place it in a "
             "shared-memory region (outputs.d_index_key), ask for a 16-bit "
             "grad_dtype, or send fewer keys (batch entries) per call"
           : "a stream's last message carries it whole too: place it in a "
             "shared-memory region (outputs.d_index_key), or send fewer "
             "keys (batch entries) per call"});
  return outputs;
}

absl::Status CheckRowOutputBytes(const ProjectionsProblem& p, int64_t rows,
                                 absl::string_view remedy,
                                 const ServerOptions& options) {
  return CheckOutputsFit(
      RowOutputBytes(p, {rows}, v1::OutputRegions::default_instance()), remedy,
      options);
}

absl::Status CheckKeySideBytes(const ProjectionsProblem& p, bool stream,
                               const ServerOptions& options) {
  const int64_t key_sum_bytes = p.key_grad_sum_size() * int64_t{sizeof(double)};
  const int64_t key_bytes =
      stream ? p.key.byte_size + p.index_key.byte_size : 0;
  if (key_bytes + key_sum_bytes <= options.max_stream_key_bytes) {
    return absl::OkStatus();
  }
  const char* call = stream ? "stream" : "call";
  return absl::ResourceExhaustedError(absl::StrCat(
      "key: the ", call, " would hold ", key_bytes + key_sum_bytes,
      " bytes for its key side (",
      stream ? absl::StrCat("key ", p.key.byte_size, ", index_key ",
                            p.index_key.byte_size, ", ")
             : "",
      "the d_index_key sum ", key_sum_bytes, "), over the limit of ",
      options.max_stream_key_bytes,
      " (--max_stream_key_bytes); send fewer keys (batch entries) per ", call));
}

absl::Status CheckThreadScratch(const IndexerKlProblem& problem,
                                const Backend& backend,
                                const ServerOptions& options) {
  if (backend.name() != "cpu") return absl::OkStatus();
  const int64_t bytes = cpu::RowScratch::BytesFor(problem);
  if (bytes <= options.max_thread_scratch_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "indexer_scores: a row of ", problem.row_length, " slots needs ", bytes,
      " bytes in each compute thread, over the limit of ",
      options.max_thread_scratch_bytes,
      " (--max_thread_scratch_bytes); a stream's blocks carry whole rows, "
      "so only a higher limit serves it"));
}

absl::Status CheckThreadScratch(const ProjectionsProblem& problem,
                                const ServerOptions& options) {
  const cpu::ProjectionTileScratch scratch = problem.thread_scratch();
  if (scratch.bytes <= options.max_thread_scratch_bytes) {
    return absl::OkStatus();
  }
  // Named by what makes most of it: the query rows' widths, or the keys
  // (dense) or slots (sparse) each row is computed against.
  const bool sparse = problem.sparse();
  const char* field = 2 * scratch.query_side_bytes > scratch.bytes ? "query"
                      : !sparse                                    ? "index_key"
                      : problem.server_topk                        ? "topk"
                                            : "topk_indices";
  return absl::ResourceExhaustedError(absl::StrCat(
      field, ": a tile of ", problem.max_tile_rows(), " query rows (H = ",
      problem.H, ", D = ", problem.D, ", H_I = ", problem.H_I,
      ", D_I = ", problem.D_I, ") against S = ", problem.S, " keys",
      sparse ? absl::StrCat(" (K = ", problem.K, " slots a row)") : "",
      " needs ", scratch.bytes,
      " bytes in each compute thread, over the limit of ",
      options.max_thread_scratch_bytes, " (--max_thread_scratch_bytes)"));
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
