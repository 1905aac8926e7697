#ifndef KLSERVE_KERNELS_CPU_BLAS_H_
#define KLSERVE_KERNELS_CPU_BLAS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

// The BLAS of the projections form (docs/blas.md): OpenBLAS's SGEMM, loaded
// with dlopen when the first CPU backend is made rather than linked.
//
// Linked, OpenBLAS's pthread build starts a thread pool from its initialiser
// before main runs (before the server blocks its drain signals), and its
// 60 KiB of static thread-local storage is carved out of every thread's
// stack, which overflows civetweb's small worker stacks. Loaded here, after
// OPENBLAS_NUM_THREADS=1 is set, it starts no thread (each product runs on
// the pool thread that calls it) and its thread-local storage is allocated
// apart from the stacks.

namespace klserve::cpu {

// Loads the library once; later calls return the first call's status
// (FAILED_PRECONDITION naming the library when it cannot be loaded).
//
// The first call sets OPENBLAS_NUM_THREADS and, on a CPU with AVX2,
// OPENBLAS_CORETYPE (blas.cc says why), and setenv is not safe while another
// thread may read the environment. So a program makes the first call while
// it runs one thread (klserve's and klctl's main do; a CpuBackend calls it
// before it starts its threads).
absl::Status LoadBlas();

// The kernel set OpenBLAS runs ("Haswell"), or "" when it is not loaded.
std::string BlasCoreName();

// What the products run, for logs: "OpenBLAS, Haswell kernels" (the kernel
// set OpenBLAS runs, and an OPENBLAS_CORETYPE it did not take), or why the
// library did not load.
std::string BlasKernels();

// C[m, n] = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or X^T:
// SGEMM on the calling thread. LoadBlas must have succeeded.
void Sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_BLAS_H_
