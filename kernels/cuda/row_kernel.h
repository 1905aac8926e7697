#ifndef KLSERVE_KERNELS_CUDA_ROW_KERNEL_H_
#define KLSERVE_KERNELS_CUDA_ROW_KERNEL_H_

// The row kernel: one CUDA block computes one row of a packed chunk of rows
// (see copy_plan.h) and writes its DeviceRowResult and gradient row.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_row_result.h"
#include "kernels/dtype.h"

namespace klserve::cuda {

// Everything one launch reads: the numeric part of the problem and device
// pointers into the chunk's buffers. Passed by value.
struct RowKernelParams {
  // The problem (IndexerKlProblem's fields of the same names).
  int64_t T = 0, S = 0, K = 0, H = 0;
  int64_t q_offset = 0;
  bool causal = false;
  bool sparse = false;
  bool per_head = false;
  bool maxtext = false;
  bool diagnostics = false;
  int64_t recall_k = 0;  // 0: no recall
  float softmax_scale = 1.0f;
  // c / N * grad_scale, as float (the CPU backend's rounding).
  float grad_scale = 0.0f;
  DType target_dtype = DType::kFloat32;
  DType scores_dtype = DType::kFloat32;
  DType grad_dtype = DType::kFloat32;

  // The chunk: n rows, global rows row_begin, row_begin + 1, ...
  int64_t row_begin = 0;
  int64_t n = 0;
  const void* target = nullptr;      // [H, n, K] target_dtype
  const void* scores = nullptr;      // [n, K] scores_dtype
  const int32_t* indices = nullptr;  // [n, K], sparse stage only
  const uint8_t* mask = nullptr;     // [n, S] attention_mask rows, or null

  // The per-batch tensors of batches batch_begin, batch_begin + 1, ...
  // (those of the call's rows), each null when absent.
  int64_t batch_begin = 0;
  const int32_t* segment_ids_q = nullptr;   // [., T]
  const int32_t* segment_ids_kv = nullptr;  // [., S]
  const uint8_t* key_padding = nullptr;     // [., S]
  const uint8_t* row_valid = nullptr;       // [., T]

  // Scratch: validity bytes [n, K] (needed when the rows have a mask or
  // indices) and the per-head target weights [n, K] (per-head only).
  uint8_t* valid = nullptr;
  float* w = nullptr;

  // Outputs: the gradient [n, K] in grad_dtype (null: none) and one result
  // per row.
  void* grad = nullptr;
  DeviceRowResult* results = nullptr;
};

// Launches the row kernel for `params` on `stream` (asynchronous); returns
// the launch's error.
cudaError_t LaunchRowKernel(const RowKernelParams& params, cudaStream_t stream);

// Whether this binary holds code the current device can run
// (cudaErrorInvalidDeviceFunction / cudaErrorNoKernelImageForDevice if not).
cudaError_t CheckRowKernelImage();

}  // namespace klserve::cuda

#endif  // KLSERVE_KERNELS_CUDA_ROW_KERNEL_H_
