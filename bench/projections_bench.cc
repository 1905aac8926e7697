// klserve_projections_bench: the projections form on the CPU backend, on the
// shapes of issue 15 (T = S = 4096, H = 16, D = 128, H_I = 8, D_I = 64;
// dense causal, sparse K = 512 with the client's indices and with the
// service's selection; and dense causal at T = S = 16384), stated as ratios
// measured in this one run:
//
//   gemm_ratio = essential FLOP/s / the machine's FP32 GEMM rate, measured
//                here through the same BLAS on as many threads (each a
//                single-threaded SGEMM of 1024^3, as the backend runs them),
//                just before each repetition (the best of each);
//   work_mib   = the peak resident memory the computation added beyond its
//                inputs and outputs (which are allocated and touched first).
//
// Essential FLOPs count what any implementation must do once per valid
// (query, key) pair: the main logits 2 H D, the indexer scores 2 H_I D_I,
// d_index_query and d_index_key 2 H_I D_I each, d_index_weights 2 H_I.
// Recomputation (the second pass over the main logits, the indexer scores
// again for the gradients) counts against the ratio.
//
// Flags: --klserve_threads=N (default 2), --cases=a,b (default all),
// --reps=N (default 3; the fastest is reported).

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/parallel_timing.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/half.h"
#include "kernels/projections_loss.h"
#include "kernels/projections_problem.h"

namespace klserve {
namespace {

using Clock = std::chrono::steady_clock;

// The FP32 GEMM rate of `threads` threads, each multiplying its own 1024^3
// matrices with the single-threaded BLAS.
double MeasureGemmRate(int threads) {
  constexpr int64_t n = 1024;
  std::vector<std::vector<float>> a(threads), b(threads), c(threads);
  for (int i = 0; i < threads; ++i) {
    a[i].assign(n * n, 0.5f);
    b[i].assign(n * n, 0.25f);
    c[i].assign(n * n, 0.0f);
  }
  const double seconds = bench::BestParallelSeconds(threads, 5, [&](int i) {
    cpu::Sgemm(false, true, n, n, n, 1.0f, a[i].data(), n, b[i].data(), n, 0.0f,
               c[i].data(), n);
  });
  return 2.0 * n * n * n * threads / seconds;
}

// Resident memory now and its peak since the last reset, in bytes
// (/proc/self/status VmRSS and VmHWM).
int64_t StatusBytes(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) {
      return std::atoll(line.c_str() + std::strlen(key)) * 1024;
    }
  }
  return -1;
}
// Writing 5 to clear_refs resets VmHWM to the current VmRSS (Linux >= 4.0).
bool ResetPeak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  return static_cast<bool>(clear);
}

constexpr int64_t kH = 16, kD = 128, kHI = 8, kDI = 64;

struct Case {
  const char* name;
  int64_t T;
  int64_t K = 0;  // sparse
  bool server_topk = false;
  // Key heads: kH (MHA), or 1 (MQA, as DeepSeek-V3.2's sparse stage has
  // its absorbed MLA), whose heads share each row's gathered keys.
  int64_t H_kv = kH;
};

struct Data {
  std::vector<uint16_t> query, key, index_query, index_key, index_weights;
  std::vector<int32_t> topk;
  std::vector<uint16_t> dq, dk, dw;
  std::vector<int32_t> selected;
  ProjectionsInputs inputs;
  ProjectionsOptions options;
  int64_t pairs = 0;  // valid (query, key) pairs
};

std::vector<uint16_t> RandomBf16(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = FloatToBFloat16(normal(rng));
  return v;
}

TensorView View(DType dtype, std::vector<int64_t> shape, const void* data,
                int64_t bytes) {
  TensorView view;
  view.dtype = dtype;
  view.shape.assign(shape.begin(), shape.end());
  view.data = data;
  view.byte_size = bytes;
  return view;
}

// BF16 projections (what a training job holds), causal, MEAN, EXACT.
std::unique_ptr<Data> MakeData(const Case& c) {
  auto d = std::make_unique<Data>();
  std::mt19937_64 rng(7);
  const int64_t T = c.T, S = c.T;
  d->query = RandomBf16(rng, T * kH * kD);
  d->key = RandomBf16(rng, S * c.H_kv * kD);
  d->index_query = RandomBf16(rng, T * kHI * kDI);
  d->index_key = RandomBf16(rng, S * kDI);
  d->index_weights = RandomBf16(rng, T * kHI);
  ProjectionsInputs& in = d->inputs;
  in.query = View(DType::kBFloat16, {1, T, kH, kD}, d->query.data(),
                  2 * d->query.size());
  in.key = View(DType::kBFloat16, {1, S, c.H_kv, kD}, d->key.data(),
                2 * d->key.size());
  in.index_query = View(DType::kBFloat16, {1, T, kHI, kDI},
                        d->index_query.data(), 2 * d->index_query.size());
  in.index_key = View(DType::kBFloat16, {1, S, kDI}, d->index_key.data(),
                      2 * d->index_key.size());
  in.index_weights = View(DType::kBFloat16, {1, T, kHI},
                          d->index_weights.data(), 2 * d->index_weights.size());
  d->options.loss.causal = true;
  d->options.loss.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kD));
  d->options.loss.grad_dtype = DType::kBFloat16;
  if (c.K == 0) {
    d->pairs = T * (T + 1) / 2;
  } else if (c.server_topk) {
    d->options.topk = c.K;
    d->selected.assign(T * c.K, 0);
    for (int64_t t = 0; t < T; ++t) d->pairs += std::min(t + 1, c.K);
  } else {
    // Each row's K keys drawn from its causal past (all of it when shorter).
    d->topk.assign(T * c.K, -1);
    std::vector<int32_t> keys;
    for (int64_t t = 0; t < T; ++t) {
      keys.resize(t + 1);
      for (int32_t s = 0; s <= t; ++s) keys[s] = s;
      const int64_t k = std::min(t + 1, c.K);
      for (int64_t j = 0; j < k; ++j) {
        std::swap(keys[j], keys[j + rng() % (t + 1 - j)]);
        d->topk[t * c.K + j] = keys[j];
      }
      d->pairs += k;
    }
    in.topk_indices =
        View(DType::kInt32, {1, T, c.K}, d->topk.data(), 4 * d->topk.size());
  }
  d->dq.assign(T * kHI * kDI, 0);
  d->dk.assign(S * kDI, 0);
  d->dw.assign(T * kHI, 0);
  return d;
}

}  // namespace
}  // namespace klserve

int main(int argc, char** argv) {
  using namespace klserve;
  int threads = 2, reps = 3;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--klserve_threads=", 0) == 0) {
      threads = std::atoi(arg.c_str() + 18);
    } else if (arg.rfind("--cases=", 0) == 0) {
      only = std::string(",").append(arg, 8).append(",");
    } else if (arg.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::atoi(arg.c_str() + 7));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", arg.c_str());
      return 2;
    }
  }
  CpuBackend backend(threads);
  if (absl::Status blas = cpu::LoadBlas(); !blas.ok()) {
    std::fprintf(stderr, "%s\n", blas.ToString().c_str());
    return 1;
  }
  std::printf("backend: %s\nBLAS: %s\n", backend.device().c_str(),
              cpu::BlasKernels().c_str());
  std::printf(
      "gemm: FP32 GEMM rate of %d threads x 1024^3 SGEMM, measured just "
      "before each repetition (the best)\n\n",
      backend.threads());
  std::printf("%-22s %10s %12s %12s %10s %10s\n", "case", "ms", "GFLOP/s",
              "gemm GFLOP/s", "gemm_ratio", "work_mib");
  const Case cases[] = {
      {"dense_causal_4k", 4096},
      {"sparse_k512_4k", 4096, 512, false},
      {"sparse_topk512_4k", 4096, 512, true},
      {"sparse_mqa_k512_4k", 4096, 512, false, 1},
      {"dense_causal_16k", 16384},
  };
  for (const Case& c : cases) {
    const std::string quoted = std::string(",").append(c.name).append(",");
    if (!only.empty() && only.find(quoted) == std::string::npos) continue;
    std::unique_ptr<Data> d = MakeData(c);
    absl::StatusOr<ProjectionsProblem> problem =
        ProjectionsProblem::Create(d->inputs, d->options);
    if (!problem.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name,
                   problem.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<ProjectionsRowData> rows =
        WholeProjectionsRows(*problem, d->inputs);
    if (!rows.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name,
                   rows.status().ToString().c_str());
      return 1;
    }
    const ProjectionsOutputs out{
        .rows = {.d_index_query = reinterpret_cast<std::byte*>(d->dq.data()),
                 .d_index_weights = reinterpret_cast<std::byte*>(d->dw.data()),
                 .topk_indices =
                     d->selected.empty() ? nullptr : d->selected.data(),
                 .capacity_rows = problem->num_rows()},
        .d_index_key = reinterpret_cast<std::byte*>(d->dk.data())};
    double best = 1e300, gemm = 0;
    int64_t work = 0;
    for (int r = 0; r < reps; ++r) {
      // The machines are shared and their speed drifts: the ceiling is
      // measured beside each repetition, not once for the run.
      gemm = std::max(gemm, MeasureGemmRate(backend.threads()));
      // Freed memory the allocator still holds goes back first, or a case
      // reusing it would look as if it needed none.
      malloc_trim(0);
      const bool peak_ok = ResetPeak();
      const int64_t before = StatusBytes("VmRSS:");
      const auto start = Clock::now();
      absl::StatusOr<IndexerKlResult> result =
          ComputeProjectionsLoss(backend, *problem, *rows, out);
      const double seconds =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (!result.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name,
                     result.status().ToString().c_str());
        return 1;
      }
      best = std::min(best, seconds);
      if (peak_ok) work = std::max(work, StatusBytes("VmHWM:") - before);
    }
    const double flops =
        static_cast<double>(d->pairs) *
        (2.0 * kH * kD + 2.0 * kHI * kDI + 4.0 * kHI * kDI + 2.0 * kHI);
    std::printf("%-22s %10.1f %12.1f %12.1f %10.3f %10.1f\n", c.name,
                best * 1e3, flops / best / 1e9, gemm / 1e9, flops / best / gemm,
                static_cast<double>(work) / (1 << 20));
  }
  return 0;
}
