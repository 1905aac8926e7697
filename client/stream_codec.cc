#include "client/stream_codec.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tensor_util.h"
#include "kernels/shape_bytes.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

v1::TensorSpec SpecOf(const v1::Tensor& tensor) {
  v1::TensorSpec spec;
  spec.set_dtype(tensor.dtype());
  *spec.mutable_shape() = tensor.shape();
  return spec;
}

// The rank of a table layout: "[B, H, T, S or K]" has 4 dimensions.
int RankOf(absl::string_view layout) {
  return static_cast<int>(std::count(layout.begin(), layout.end(), ',')) + 1;
}

// Checks a per-row tensor's rank and leading [B, ..., T] dimensions, which
// `source` (the tensor that fixed B and T) gave.
absl::Status CheckRowShape(const RequestTensor& tensor, const v1::Tensor& t,
                           int64_t batch, int64_t rows_per_batch,
                           absl::string_view source) {
  const auto& shape = t.shape();
  const int t_axis = tensor.per_head ? 2 : 1;
  if (shape.size() != RankOf(tensor.layout) || shape[0] != batch ||
      shape[t_axis] != rows_per_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        tensor.name, ": shape must be ", tensor.layout, " with B = ", batch,
        " and T = ", rows_per_batch, " (from ", source, "), got [",
        absl::StrJoin(shape, ","), "]"));
  }
  return CheckTensorBytes(tensor.name, t);
}

// The bytes of one row's answer in a GradBlock, which the block's answer
// must fit as its rows must: the gradients (of indexer_scores, or of
// index_query and index_weights; d_index_key comes whole in the last
// message), the service's top-k selection and row KL. The shapes are checked
// against their bytes first, so a row's count is within 64 bits.
int64_t AnswerRowBytes(const v1::ComputeLossRequest& request, RequestForm form,
                       int64_t row_width) {
  const v1::LossOptions& o = request.options();
  int64_t bytes = 0;
  if (!o.skip_grad()) {
    // A dtype the wire has no name for is the server's to name: counted
    // here as the widest.
    const int64_t grad =
        WireDTypeSize(o.grad_dtype().empty() ? "FP32" : o.grad_dtype())
            .value_or(4);
    int64_t elements = row_width;
    if (form == RequestForm::kProjections) {
      elements = 0;
      for (const v1::Tensor* t :
           {&request.index_query(), &request.index_weights()}) {
        int64_t row = 1;
        for (int d = 2; d < t->shape_size(); ++d) row *= t->shape(d);
        elements += row;
      }
    }
    bytes += elements * grad;
  }
  if (form == RequestForm::kProjections && o.topk() > 0) {
    bytes += int64_t{o.topk()} * 4;
  }
  if (o.want_row_kl()) bytes += 8;
  return bytes;
}

absl::Status ProtocolError(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("ComputeLossStream: server broke the protocol: ", what));
}

}  // namespace

bool StreamCarries(const v1::ComputeLossRequest& request) {
  return !(request.has_query() &&
           request.options().reduction() == v1::REDUCTION_MEAN_VALID &&
           !request.has_row_valid() &&
           (request.has_topk_indices() || request.has_attention_mask()));
}

absl::StatusOr<RequestSlicer> RequestSlicer::Create(
    const v1::ComputeLossRequest& request) {
  RequestSlicer slicer(request);
  const RequestForm form = FormOf(request);
  slicer.form_ = form;
  // The tensor whose [B, T, ...] fixes B and T: the scores, or the query.
  const RequestTensor& source = *FindRequestTensor(
      form == RequestForm::kProjections ? "query" : "indexer_scores");
  const v1::Tensor* first = FindTensor(request, source);
  const int rank = RankOf(source.layout);
  if (first == nullptr || first->shape().size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        source.name, ": must be given with shape ", source.layout, ", got [",
        first == nullptr ? "" : absl::StrJoin(first->shape(), ","), "]"));
  }
  for (const int64_t d : first->shape()) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.name, ": dimensions must be >= 1, got [",
                       absl::StrJoin(first->shape(), ","), "]"));
    }
  }
  // The projections form counts N without the rows, or not in a stream (the
  // server refuses it).
  slicer.counts_first_ =
      form == RequestForm::kLogits &&
      request.options().reduction() == v1::REDUCTION_MEAN_VALID &&
      !request.has_row_valid();
  slicer.batch_ = first->shape(0);
  slicer.rows_per_batch_ = first->shape(1);
  slicer.row_width_ = first->shape(rank - 1);

  // The tensor that fixes B and T first, so a bad one is named as such
  // rather than as another that disagrees with it.
  for (const bool is_source : {true, false}) {
    for (const RequestTensor& tensor : PerRowTensors()) {
      const v1::Tensor* t = FindTensor(request, tensor);
      if ((&tensor == &source) != is_source || t == nullptr ||
          !TakenIn(form, tensor)) {
        continue;
      }
      RETURN_IF_ERROR(CheckRowShape(tensor, *t, slicer.batch_,
                                    slicer.rows_per_batch_, source.name));
      const auto& shape = t->shape();
      const int t_axis = tensor.per_head ? 2 : 1;
      Part part{.tensor = &tensor,
                .data = &t->data(),
                .heads = tensor.per_head ? shape[1] : 1};
      ASSIGN_OR_RETURN(part.head_row_bytes, WireDTypeSize(t->dtype()));
      for (int d = t_axis + 1; d < shape.size(); ++d) {
        part.head_row_bytes *= shape[d];
      }
      slicer.parts_.push_back(part);
    }
  }
  slicer.answer_row_bytes_ = AnswerRowBytes(request, form, slicer.row_width_);
  return slicer;
}

v1::StreamHeader RequestSlicer::MakeHeader() const {
  const v1::ComputeLossRequest& request = *request_;
  v1::StreamHeader header;
  header.set_request_id(request.request_id());
  if (request.has_tags()) *header.mutable_tags() = request.tags();
  if (request.has_options()) *header.mutable_options() = request.options();
  for (const RequestTensor& tensor : kRequestTensors) {
    const v1::Tensor* t = FindTensor(request, tensor);
    if (t == nullptr) continue;
    if (tensor.role == TensorRole::kPerRow) {
      *MutableSpec(header, tensor) = SpecOf(*t);
    } else {
      *MutableTensor(header, tensor) = *t;
    }
  }
  return header;
}

void RequestSlicer::FillPart(const Part& part, int64_t row_begin,
                             int64_t num_rows, std::string* out) const {
  out->clear();
  out->reserve(part.heads * num_rows * part.head_row_bytes);
  const int64_t row_end = row_begin + num_rows;
  for (int64_t h = 0; h < part.heads; ++h) {
    // Within one batch entry a head's rows are contiguous; a block that
    // crosses batch boundaries is copied as one run per batch entry.
    int64_t r = row_begin;
    while (r < row_end) {
      const int64_t b = r / rows_per_batch_;
      const int64_t t = r % rows_per_batch_;
      const int64_t run = std::min(row_end - r, rows_per_batch_ - t);
      const int64_t first_row = (b * part.heads + h) * rows_per_batch_ + t;
      out->append(part.data->data() + first_row * part.head_row_bytes,
                  run * part.head_row_bytes);
      r += run;
    }
  }
}

void RequestSlicer::FillBlock(int64_t row_begin, int64_t num_rows,
                              v1::RowBlock* block) const {
  assert(row_begin >= 0 && num_rows >= 1 &&
         row_begin + num_rows <= this->num_rows());
  block->set_row_begin(row_begin);
  block->set_num_rows(num_rows);
  // Fields of tensors the request lacks stay empty.
  for (const RequestTensor& tensor : PerRowTensors()) {
    tensor.mutable_block_bytes(*block)->clear();
  }
  for (const Part& part : parts_) {
    FillPart(part, row_begin, num_rows,
             part.tensor->mutable_block_bytes(*block));
  }
}

int64_t RequestSlicer::row_bytes() const {
  int64_t bytes = 0;
  for (const Part& part : parts_) bytes += part.heads * part.head_row_bytes;
  return bytes;
}

int64_t RequestSlicer::BlockRowsFor(int64_t block_bytes) const {
  const int64_t per_row =
      std::max({row_bytes(), answer_row_bytes_, int64_t{1}});
  return std::clamp<int64_t>(block_bytes / per_row, 1, num_rows());
}

ResponseAssembler::ResponseAssembler(absl::Span<const int64_t> scores_shape,
                                     bool counting_pass)
    : batch_(scores_shape.size() == 3 ? scores_shape[0] : 0),
      rows_per_batch_(scores_shape.size() == 3 ? scores_shape[1] : 0),
      row_width_(scores_shape.size() == 3 ? scores_shape[2] : 0),
      counting_(counting_pass) {}

absl::Status ResponseAssembler::Add(v1::GradBlock& block) {
  const int64_t total_rows = batch_ * rows_per_batch_;
  if (block.row_begin() != next_row_ || block.num_rows() < 1 ||
      block.num_rows() > total_rows - next_row_) {
    return ProtocolError(absl::StrCat(
        "grad block rows [", block.row_begin(), ", +", block.num_rows(),
        ") do not continue at row ", next_row_, " of ", total_rows));
  }
  const int64_t n = block.num_rows();
  if (counting_) {
    if (block.has_grad() || block.has_row_kl()) {
      return ProtocolError(absl::StrCat("counting block at row ", next_row_,
                                        " carries grad or row_kl"));
    }
    next_row_ += n;
    if (next_row_ == total_rows) {  // the gradient pass follows
      next_row_ = 0;
      counting_ = false;
    }
    return absl::OkStatus();
  }

  const bool grad_here = !block.grad().data().empty();
  const bool row_kl_here = !block.row_kl().data().empty();
  if (blocks_ == 0) {
    has_grad_ = grad_here;
    has_row_kl_ = row_kl_here;
    if (has_grad_) {
      grad_dtype_ = block.grad().dtype();
      absl::StatusOr<int64_t> size = WireDTypeSize(grad_dtype_);
      if (!size.ok()) return ProtocolError(size.status().message());
      grad_element_bytes_ = *size;
      // Reserved, not resized: blocks are appended in order, so the bytes
      // are written once (no zero fill of a possibly 1 GiB buffer).
      grad_data_.reserve(total_rows * row_width_ * grad_element_bytes_);
    }
    if (has_row_kl_) row_kl_data_.reserve(total_rows * sizeof(double));
  }
  if (grad_here != has_grad_ || row_kl_here != has_row_kl_) {
    return ProtocolError(
        absl::StrCat("grad block at row ", next_row_,
                     " carries grad/row_kl unlike the first block"));
  }
  if (has_grad_) {
    const int64_t expected = n * row_width_ * grad_element_bytes_;
    if (block.grad().dtype() != grad_dtype_ ||
        static_cast<int64_t>(block.grad().data().size()) != expected) {
      return ProtocolError(absl::StrCat(
          "grad block at row ", next_row_, ": grad must be ", expected,
          " bytes of ", grad_dtype_, ", got ", block.grad().data().size(),
          " bytes of ", block.grad().dtype()));
    }
    grad_data_.append(block.grad().data());
  }
  if (has_row_kl_) {
    const int64_t expected = n * static_cast<int64_t>(sizeof(double));
    if (block.row_kl().dtype() != "FP64" ||
        static_cast<int64_t>(block.row_kl().data().size()) != expected) {
      return ProtocolError(absl::StrCat(
          "grad block at row ", next_row_, ": row_kl must be ", expected,
          " bytes of FP64, got ", block.row_kl().data().size(), " bytes of ",
          block.row_kl().dtype()));
    }
    row_kl_data_.append(block.row_kl().data());
  }
  next_row_ += n;
  ++blocks_;
  return absl::OkStatus();
}

ProjectionsResponseAssembler::ProjectionsResponseAssembler(
    int64_t batch, int64_t rows_per_batch)
    : batch_(batch), rows_per_batch_(rows_per_batch) {
  for (size_t i = 0; i < std::size(kOutputs); ++i)
    outputs_[i].name = kOutputs[i];
}

absl::Status ProjectionsResponseAssembler::Add(v1::GradBlock& block) {
  const int64_t total_rows = batch_ * rows_per_batch_;
  const int64_t n = block.num_rows();
  if (block.row_begin() != next_row_ || n < 0 || n > total_rows - next_row_) {
    return ProtocolError(absl::StrCat("grad block rows [", block.row_begin(),
                                      ", +", n, ") do not continue at row ",
                                      next_row_, " of ", total_rows));
  }
  const v1::Tensor* tensors[] = {&block.d_index_query(),
                                 &block.d_index_weights(),
                                 &block.topk_indices(), &block.row_kl()};
  if (block.has_grad()) {
    return ProtocolError(absl::StrCat("grad block at row ", next_row_,
                                      " carries grad in the projections form"));
  }
  for (size_t i = 0; i < std::size(kOutputs); ++i) {
    Output& output = outputs_[i];
    const v1::Tensor& t = *tensors[i];
    const bool here = !t.data().empty();
    if (n == 0) {  // a block that completed no rows carries nothing
      if (here) {
        return ProtocolError(absl::StrCat("grad block of no rows at row ",
                                          next_row_, " carries ", output.name));
      }
      continue;
    }
    if (!seen_rows_) {
      output.present = here;
      if (here) {
        output.dtype = t.dtype();
        output.row_shape.assign(t.shape().begin() + std::min(1, t.shape_size()),
                                t.shape().end());
        absl::StatusOr<int64_t> size = WireDTypeSize(output.dtype);
        if (!size.ok()) return ProtocolError(size.status().message());
        // The server's dimensions, taken only when they give a size that
        // all the rows' bytes can have.
        const std::optional<int64_t> row_bytes =
            ShapeBytes(*size, output.row_shape);
        if (absl::c_any_of(output.row_shape, [](int64_t d) { return d < 1; }) ||
            !row_bytes.has_value() ||
            !ShapeBytes(*row_bytes, {total_rows}).has_value()) {
          return ProtocolError(
              absl::StrCat("grad block at row ", next_row_, ": ", output.name,
                           " has rows shaped [",
                           absl::StrJoin(output.row_shape, ", "), "]"));
        }
        output.row_bytes = *row_bytes;
      }
    }
    if (here != output.present) {
      return ProtocolError(absl::StrCat("grad block at row ", next_row_,
                                        " carries ", output.name,
                                        " unlike the first block"));
    }
    if (!here) continue;
    const bool same_shape =
        t.shape_size() == static_cast<int>(output.row_shape.size()) + 1 &&
        t.shape(0) == n &&
        std::equal(output.row_shape.begin(), output.row_shape.end(),
                   t.shape().begin() + 1);
    if (t.dtype() != output.dtype || !same_shape ||
        static_cast<int64_t>(t.data().size()) != n * output.row_bytes) {
      return ProtocolError(absl::StrCat(
          "grad block at row ", next_row_, ": ", output.name, " must be ",
          n * output.row_bytes, " bytes of ", output.dtype, " in ", n,
          " rows, got ", t.data().size(), " bytes of ", t.dtype()));
    }
    // Appended, not reserved for every row: the row size is the server's
    // word, and a wrong one must not make the client allocate for it.
    output.data.append(t.data());
  }
  if (n > 0) seen_rows_ = true;
  next_row_ += n;
  return absl::OkStatus();
}

absl::StatusOr<v1::ComputeLossResponse> ProjectionsResponseAssembler::Finish(
    v1::ComputeLossResponse final_result) {
  const int64_t total_rows = batch_ * rows_per_batch_;
  if (next_row_ != total_rows) {
    return ProtocolError(absl::StrCat("result arrived after ", next_row_,
                                      " of ", total_rows, " rows"));
  }
  const bool in_result[] = {
      final_result.has_d_index_query(), final_result.has_d_index_weights(),
      final_result.has_topk_indices(), final_result.has_row_kl()};
  for (size_t i = 0; i < std::size(kOutputs); ++i) {
    if (in_result[i]) {
      return ProtocolError(absl::StrCat("the result carries ", kOutputs[i]));
    }
  }
  // Only the tensors the blocks carried are set, as in the unary response.
  v1::Tensor* (v1::ComputeLossResponse::*const mutable_tensor[])() = {
      &v1::ComputeLossResponse::mutable_d_index_query,
      &v1::ComputeLossResponse::mutable_d_index_weights,
      &v1::ComputeLossResponse::mutable_topk_indices,
      &v1::ComputeLossResponse::mutable_row_kl};
  for (size_t i = 0; i < std::size(kOutputs); ++i) {
    Output& output = outputs_[i];
    if (!output.present) continue;
    v1::Tensor& t = *(final_result.*mutable_tensor[i])();
    t.set_dtype(output.dtype);
    t.add_shape(batch_);
    t.add_shape(rows_per_batch_);
    for (const int64_t d : output.row_shape) t.add_shape(d);
    *t.mutable_data() = std::move(output.data);
  }
  return final_result;
}

absl::StatusOr<v1::ComputeLossResponse> ResponseAssembler::Finish(
    v1::ComputeLossResponse final_result) {
  const int64_t total_rows = batch_ * rows_per_batch_;
  if (next_row_ != total_rows) {
    return ProtocolError(absl::StrCat("result arrived after ", next_row_,
                                      " of ", total_rows, " rows"));
  }
  if (has_grad_) {
    v1::Tensor* grad = final_result.mutable_grad();
    grad->set_dtype(grad_dtype_);
    grad->clear_shape();
    grad->add_shape(batch_);
    grad->add_shape(rows_per_batch_);
    grad->add_shape(row_width_);
    *grad->mutable_data() = std::move(grad_data_);
  }
  if (has_row_kl_) {
    v1::Tensor* row_kl = final_result.mutable_row_kl();
    row_kl->set_dtype("FP64");
    row_kl->clear_shape();
    row_kl->add_shape(batch_);
    row_kl->add_shape(rows_per_batch_);
    *row_kl->mutable_data() = std::move(row_kl_data_);
  }
  return final_result;
}

}  // namespace klserve
