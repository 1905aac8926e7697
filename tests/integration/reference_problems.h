#ifndef KLSERVE_TESTS_INTEGRATION_REFERENCE_PROBLEMS_H_
#define KLSERVE_TESTS_INTEGRATION_REFERENCE_PROBLEMS_H_

// The wire request as the float64 references of tests/reference take it, and
// the server's answer held against theirs. The tensors are decoded here with
// the references' own 16-bit codecs (no kernels code), so that a test
// compares the server with an independent implementation.

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "klserve/v1/klserve.pb.h"
#include "tests/reference/indexer_kl_reference.h"
#include "tests/reference/projections_reference.h"

namespace klserve::integration {

// A float tensor's (FP32, BF16, FP16) or an INT32/BOOL tensor's elements as
// double / int64, in order.
std::vector<double> DecodeFloats(const v1::Tensor& tensor);
std::vector<int64_t> DecodeInts(const v1::Tensor& tensor);

// The logits-form request `request` as the reference's problem.
klref::RefProblem RefProblemOf(const v1::ComputeLossRequest& request);

// The projections-form request `request` (query set) as the reference's.
klref::RefProjections RefProjectionsOf(const v1::ComputeLossRequest& request);

// Whether `actual` (a gradient tensor of the response, in its dtype) is
// `expected` to within `tolerance` relative to the largest |expected| (the
// tolerance the gradient dtype's rounding allows).
::testing::AssertionResult CloseTensor(const std::vector<double>& expected,
                                       const v1::Tensor& actual,
                                       double tolerance);

// The response's result (loss, unscaled loss, N and the row counts) and,
// when present, row_kl against the reference's, to `tolerance` relative.
::testing::AssertionResult CloseResult(const klref::RefResult& expected,
                                       const v1::ComputeLossResponse& actual,
                                       double tolerance);

// Each head's log-sum-exp over the row's valid keys, FP32 [B, H, T], from
// the reference's logits and validity; 0 on rows without a valid key.
v1::Tensor LseOf(const klref::RefProjections& p);

// Relative tolerance of a gradient in `grad_dtype` ("FP32", "BF16",
// "FP16"): a few of its units in the last place, as the kernels compute in
// float32 and round once.
double GradTolerance(const std::string& grad_dtype);

}  // namespace klserve::integration

#endif  // KLSERVE_TESTS_INTEGRATION_REFERENCE_PROBLEMS_H_
