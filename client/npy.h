#ifndef KLSERVE_CLIENT_NPY_H_
#define KLSERVE_CLIENT_NPY_H_

// NumPy .npy files <-> klserve.v1.Tensor.
//
// Element types (descr <-> wire dtype):
//   '<f4' FP32, '<f2' FP16, '<i4' INT32, '|b1' or '|u1' BOOL (read; BOOL is
//   written as '|b1'), '<f8' FP64, and '<u2' BF16.
// A request input is read only from the descrs its tensor's DTypeRule takes
// (kernels/input_dtypes.h): float32, float16 or bfloat16 as '<u2' for the
// float inputs, int32 for indices, bool or uint8 for masks.
// NumPy has no bfloat16; klserve's convention is to carry bfloat16 bits as
// uint16 ('<u2'), which `arr.view(np.uint16)` / `.view(ml_dtypes.bfloat16)`
// convert without copying. Only C order is supported. Reading accepts
// format versions 1.0, 2.0 and 3.0; writing produces 1.0 (2.0 only if the
// header would not fit 1.0's 16-bit length).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "klserve/v1/klserve.pb.h"
#include "proto/request_tensors.h"

namespace klserve {

// The parsed fixed part of an .npy file.
struct NpyHeader {
  std::string dtype;           // wire name, e.g. "FP32"
  std::vector<int64_t> shape;  // empty for a 0-d array (one element)
  int64_t data_offset = 0;     // bytes from the file start to the data
  int64_t data_bytes = 0;      // prod(shape) * element size
};

// Parses the magic, version, and header dict at the start of `file_prefix`
// (which must hold at least the whole header; it may hold more). Errors are
// INVALID_ARGUMENT naming what is wrong (bad magic, unsupported descr,
// fortran_order True, malformed dict). An unsupported descr is named with its
// type as NumPy spells it ("unsupported descr '<i8' (int64)"), followed by
// the descrs taken.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view file_prefix);

// The bytes of a version 1.0 header (magic through the '\n' that ends the
// dict) for `dtype`/`shape`, padded with spaces so that the data starts at a
// multiple of 64 bytes. INVALID_ARGUMENT for a dtype with no descr above.
absl::StatusOr<std::string> EncodeNpyHeader(absl::string_view dtype,
                                            const std::vector<int64_t>& shape);

// Reads a whole .npy file. The data is read straight into the returned
// tensor's bytes (one copy, from the kernel). The file's size must be exactly
// header + data. An errno-derived status (e.g. NOT_FOUND) when the file cannot
// be opened.
absl::StatusOr<v1::Tensor> ReadNpy(const std::string& path);

// Reads a request input whose tensor's dtypes follow `rule`: as above, but a
// descr `rule` does not take is an unsupported descr, and the message lists
// the ones it takes (with the fix for an ml_dtypes bfloat16 array saved as
// it is, '<V2').
absl::StatusOr<v1::Tensor> ReadNpy(const std::string& path, DTypeRule rule);

// Parses an in-memory .npy image (one copy of the data into the tensor).
absl::StatusOr<v1::Tensor> ParseNpy(absl::string_view file_bytes);

// Writes `tensor` as a version 1.0 .npy file, its bytes written directly
// from the tensor. INVALID_ARGUMENT when the data size does not match the
// shape or the dtype has no descr.
absl::Status WriteNpy(const std::string& path, const v1::Tensor& tensor);

// The .npy image of `tensor` in memory (header + data).
absl::StatusOr<std::string> SerializeNpy(const v1::Tensor& tensor);

}  // namespace klserve

#endif  // KLSERVE_CLIENT_NPY_H_
