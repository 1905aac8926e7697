#ifndef KLSERVE_KERNELS_CUDA_DEVICE_BUFFERS_H_
#define KLSERVE_KERNELS_CUDA_DEVICE_BUFFERS_H_

// Grow-only memory the CUDA backend reuses across calls: pinned host staging
// buffers and device buffers. Neither keeps its contents when it grows. Not
// thread-safe: each belongs to one RowPipeline, used by one call at a time.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace klserve::cuda {

// OK for cudaSuccess; otherwise RESOURCE_EXHAUSTED for an allocation failure
// and INTERNAL for anything else, "cuda: <what>: <error name>: <text>".
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  // At least `bytes` bytes; grows in whole MiB, never shrinks.
  absl::Status Reserve(int64_t bytes);
  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  // At least `bytes` bytes on the current device; grows in whole MiB, never
  // shrinks. Growing frees the old block with cudaFree, which waits for the
  // device: call it only between computations (it is rare: the buffers
  // settle at the largest request).
  absl::Status Reserve(int64_t bytes);
  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_DEVICE_BUFFERS_H_
