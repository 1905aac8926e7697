#include "client/stream_codec.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tensor_util.h"
#include "kernels/status_macros.h"

namespace klserve {
namespace {

v1::TensorSpec SpecOf(const v1::Tensor& tensor) {
  v1::TensorSpec spec;
  spec.set_dtype(tensor.dtype());
  *spec.mutable_shape() = tensor.shape();
  return spec;
}

// Checks a per-row tensor's rank and leading [B, ..., T] dimensions.
absl::Status CheckRowShape(absl::string_view field, const v1::Tensor& tensor,
                           int rank, int t_axis, int64_t batch,
                           int64_t rows_per_batch, absl::string_view layout) {
  const auto& shape = tensor.shape();
  if (shape.size() != rank || shape[0] != batch ||
      shape[t_axis] != rows_per_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape must be ", layout, " with B = ", batch,
        " and T = ", rows_per_batch, " (from indexer_scores), got [",
        absl::StrJoin(shape, ","), "]"));
  }
  return CheckTensorBytes(field, tensor);
}

absl::Status ProtocolError(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("ComputeLossStream: server broke the protocol: ", what));
}

}  // namespace

absl::StatusOr<RequestSlicer> RequestSlicer::Create(
    const v1::ComputeLossRequest& request) {
  RequestSlicer slicer(request);
  if (FormOf(request) == RequestForm::kProjections) {
    return absl::InvalidArgumentError(
        "query: the stream does not carry the projections form yet, got "
        "query; send it as one ComputeLoss message");
  }
  const v1::Tensor& scores = request.indexer_scores();
  if (!request.has_indexer_scores() || scores.shape().size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indexer_scores: must be given with shape [B, T, S or K], got [",
        absl::StrJoin(scores.shape(), ","), "]"));
  }
  if (scores.shape(0) < 1 || scores.shape(1) < 1 || scores.shape(2) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexer_scores: dimensions must be >= 1, got [",
                     absl::StrJoin(scores.shape(), ","), "]"));
  }
  slicer.counts_first_ =
      request.options().reduction() == v1::REDUCTION_MEAN_VALID &&
      !request.has_row_valid();
  slicer.batch_ = scores.shape(0);
  slicer.rows_per_batch_ = scores.shape(1);
  slicer.row_width_ = scores.shape(2);

  // The scores (the one required tensor) first: they fix B and T, so a bad
  // scores tensor is named as such rather than as the target that disagrees
  // with it.
  for (const bool required : {true, false}) {
    for (const RequestTensor& tensor : PerRowTensors()) {
      const v1::Tensor* t = FindTensor(request, tensor);
      if (RequiredIn(RequestForm::kLogits, tensor) != required ||
          t == nullptr) {
        continue;
      }
      RETURN_IF_ERROR(CheckRowShape(
          tensor.name, *t, tensor.per_head ? 4 : 3, tensor.per_head ? 2 : 1,
          slicer.batch_, slicer.rows_per_batch_,
          tensor.per_head ? "[B, H, T, S or K]" : "[B, T, S or K]"));
      const auto& shape = t->shape();
      Part part{.tensor = &tensor,
                .data = &t->data(),
                .heads = tensor.per_head ? shape[1] : 1};
      ASSIGN_OR_RETURN(const int64_t element_bytes, WireDTypeSize(t->dtype()));
      part.head_row_bytes = shape[shape.size() - 1] * element_bytes;
      slicer.parts_.push_back(part);
    }
  }
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
  const int64_t per_row = std::max<int64_t>(row_bytes(), 1);
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
