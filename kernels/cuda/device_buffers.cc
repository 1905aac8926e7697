#include "kernels/cuda/device_buffers.h"

#include "absl/strings/str_cat.h"

namespace klserve::cuda {
namespace {

constexpr int64_t kGrain = int64_t{1} << 20;

int64_t RoundUp(int64_t bytes) {
  return (bytes + kGrain - 1) / kGrain * kGrain;
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat("cuda: ", what, ": ", cudaGetErrorName(error), ": ",
                   cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

absl::Status PinnedBuffer::Reserve(int64_t bytes) {
  if (bytes <= size_) return absl::OkStatus();
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  size_ = 0;
  const int64_t size = RoundUp(bytes);
  void* p = nullptr;
  const cudaError_t error = cudaMallocHost(&p, static_cast<size_t>(size));
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for later launch checks
    return CudaStatus(error,
                      absl::StrCat("pinned host buffer of ", size, " bytes"));
  }
  data_ = static_cast<std::byte*>(p);
  size_ = size;
  return absl::OkStatus();
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::Status DeviceBuffer::Reserve(int64_t bytes) {
  if (bytes <= size_) return absl::OkStatus();
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  size_ = 0;
  const int64_t size = RoundUp(bytes);
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, static_cast<size_t>(size));
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for later launch checks
    return CudaStatus(error, absl::StrCat("device buffer of ", size, " bytes"));
  }
  data_ = static_cast<std::byte*>(p);
  size_ = size;
  return absl::OkStatus();
}

}  // namespace klserve::cuda
