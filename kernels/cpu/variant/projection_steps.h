#ifndef KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_STEPS_H_
#define KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_STEPS_H_

// A projection tile's work in steps, with its StopCheck asked between them,
// so that a caller gone or past --max_compute_duration gets its thread back
// within one step, however many keys, heads and widths one tile holds (a
// single query row against 2^22 keys and heads is hours of work). Every
// product through the BLAS runs in steps of at most kStepMultiplyAdds
// multiply-adds (at least one row of its result each), split along the rows
// of its result. The split changes a split product's bits (OpenBLAS's edge
// kernels sum each piece's last rows in their own order), so it must depend
// on the shapes alone, as here: the bits then do not depend on threads,
// blocks or CPU. The tiles' loops over key tiles, heads and rows ask Go()
// at each turn.

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/variant/isa_namespace.h"
#include "kernels/stop_check.h"

namespace klserve::cpu::KLSERVE_ISA {

// Milliseconds of one core, and enough work that the BLAS runs at its rate.
inline constexpr int64_t kStepMultiplyAdds = int64_t{1} << 26;

class ProjectionSteps {
 public:
  explicit ProjectionSteps(const StopCheck* stop) : stop_(stop) {}

  // Whether to go on: asks the check, unless a step said stop already.
  bool Go() {
    if (status_.ok() && stop_ != nullptr && *stop_) status_ = (*stop_)();
    return status_.ok();
  }
  bool stopped() const { return !status_.ok(); }
  // Why the tile stopped (OK while it goes on).
  const absl::Status& status() const { return status_; }

  // C[m, n] = alpha * A[m, k] B[n, k]^T (+ beta * C), row-major.
  void GemmNT(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
    InSteps(m, n, k, beta, c, ldc, [&](int64_t i, int64_t rows) {
      Sgemm(false, true, rows, n, k, alpha, a + i * lda, lda, b, ldb, beta,
            c + i * ldc, ldc);
    });
  }
  // C[m, n] = A[m, k] B[k, n] + beta * C.
  void GemmNN(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    InSteps(m, n, k, beta, c, ldc, [&](int64_t i, int64_t rows) {
      Sgemm(false, false, rows, n, k, 1.0f, a + i * lda, lda, b, ldb, beta,
            c + i * ldc, ldc);
    });
  }
  // C[m, n] = A[k, m]^T B[k, n].
  void GemmTN(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc) {
    InSteps(m, n, k, 0.0f, c, ldc, [&](int64_t i, int64_t rows) {
      Sgemm(true, false, rows, n, k, 1.0f, a + i, lda, b, ldb, 0.0f,
            c + i * ldc, ldc);
    });
  }

 private:
  // product(i, rows) computes the result's rows [i, i + rows). Once stopped,
  // the rows left are zeroed where they would have been overwritten, so that
  // what the tile reads before it next asks is finite.
  template <typename Product>
  void InSteps(int64_t m, int64_t n, int64_t k, float beta, float* c,
               int64_t ldc, const Product& product) {
    const int64_t per_row = std::max<int64_t>(n * k, 1);
    const int64_t rows = std::clamp<int64_t>(kStepMultiplyAdds / per_row, 1,
                                             std::max<int64_t>(m, 1));
    for (int64_t i = 0; i < m; i += rows) {
      const int64_t step = std::min(rows, m - i);
      if (Go()) {
        product(i, step);
      } else if (beta == 0.0f) {
        for (int64_t r = i; r < i + step; ++r) {
          std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
        }
      }
    }
  }

  const StopCheck* stop_;
  absl::Status status_;
};

}  // namespace klserve::cpu::KLSERVE_ISA

#endif  // KLSERVE_KERNELS_CPU_VARIANT_PROJECTION_STEPS_H_
