// klserve_gpu_bench: the CUDA backend per input form on realistic shapes,
// each figure set against the device-to-device copy bandwidth measured in
// the same run. Run by scripts/gpu-check.sh; prints a table last.
//
// Two times per case: the row kernel alone with its data resident on the
// device (what the GPU does; compared with the copy ceiling), and the whole
// ComputeIndexerKl call from host memory (what a request costs today,
// host-device transfers included).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/resident_timing.h"
#include "kernels/half.h"
#include "kernels/loss.h"

namespace klserve {
namespace {

struct Case {
  std::string name;
  InputForm form = InputForm::kDenseAggregated;
  DType dtype = DType::kFloat32;
  int64_t H = 1, T = 4096, S = 4096, K = 4096;
};

// Random row-major data of `count` elements of `dtype`.
std::vector<std::byte> Random(DType dtype, int64_t count, bool positive,
                              std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::byte> bytes(count * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const float v = positive ? std::exp(normal(rng) / 3) : normal(rng);
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h =
          dtype == DType::kBFloat16 ? FloatToBFloat16(v) : FloatToFloat16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace
}  // namespace klserve

int main() {
  using namespace klserve;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(0);
  if (!backend.ok()) {
    std::fprintf(stderr, "klserve_gpu_bench: %s\n",
                 backend.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<double> copy =
      cuda::DeviceCopyBytesPerSecond(int64_t{1} << 30, 20);
  if (!copy.ok()) {
    std::fprintf(stderr, "klserve_gpu_bench: %s\n",
                 copy.status().ToString().c_str());
    return 1;
  }
  std::printf("device: %s; device-to-device copy %.0f GB/s (read + write)\n",
              (*backend)->device().c_str(), *copy / 1e9);

  const std::vector<Case> cases = {
      {"dense_agg_fp32", InputForm::kDenseAggregated, DType::kFloat32},
      {"dense_agg_bf16", InputForm::kDenseAggregated, DType::kBFloat16},
      {"dense_perhead_fp32", InputForm::kDensePerHead, DType::kFloat32, 16},
      {"dense_perhead_bf16", InputForm::kDensePerHead, DType::kBFloat16, 16},
      {"sparse_agg_fp32", InputForm::kSparseAggregated, DType::kFloat32, 1,
       4096, 4096, 2048},
      {"sparse_perhead_bf16", InputForm::kSparsePerHead, DType::kBFloat16, 16,
       4096, 4096, 2048},
  };
  struct Row {
    std::string name;
    double kernel_ms, kernel_gbps, copy_ratio, call_ms;
  };
  std::vector<Row> rows;
  std::mt19937 rng(1);
  for (const Case& c : cases) {
    const int64_t slots = c.T * c.K;
    std::vector<std::byte> target =
        Random(c.dtype, c.H * slots, !IsPerHead(c.form), rng);
    std::vector<std::byte> scores = Random(c.dtype, slots, false, rng);
    std::vector<int32_t> indices;
    IndexerKlInputs in;
    TensorView target_view{
        c.dtype, {}, target.data(), static_cast<int64_t>(target.size())};
    if (IsPerHead(c.form)) {
      target_view.shape = {1, c.H, c.T, c.K};
      in.attention_logits = target_view;
    } else {
      target_view.shape = {1, c.T, c.K};
      in.attention_weights = target_view;
    }
    in.indexer_scores = {c.dtype,
                         {1, c.T, c.K},
                         scores.data(),
                         static_cast<int64_t>(scores.size())};
    IndexerKlOptions options;
    options.scaling_factor = 0.01;
    options.grad_dtype = c.dtype;
    if (IsSparse(c.form)) {
      std::vector<int32_t> keys(c.S);
      std::iota(keys.begin(), keys.end(), 0);
      for (int64_t t = 0; t < c.T; ++t) {
        std::shuffle(keys.begin(), keys.end(), rng);
        indices.insert(indices.end(), keys.begin(), keys.begin() + c.K);
      }
      in.topk_indices =
          TensorView{DType::kInt32, {1, c.T, c.K}, indices.data(), slots * 4};
      options.num_keys = c.S;
    }
    absl::StatusOr<IndexerKlProblem> problem =
        IndexerKlProblem::Create(in, options);
    if (!problem.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(),
                   problem.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<RowData> row_data = WholeRowData(*problem, in);
    if (!row_data.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(),
                   row_data.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<double> kernel =
        cuda::ResidentKernelSeconds(*problem, *row_data, 10);
    if (!kernel.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(),
                   kernel.status().ToString().c_str());
      return 1;
    }
    std::vector<std::byte> grad(slots * DTypeSize(c.dtype));
    LossOutputs outputs{grad.data(), static_cast<int64_t>(grad.size())};
    double call = 1e30;
    for (int i = 0; i < 5; ++i) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<IndexerKlResult> result =
          ComputeIndexerKl(**backend, *problem, *row_data, outputs);
      call = std::min(call, Seconds(std::chrono::steady_clock::now() - start));
      if (!result.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name.c_str(),
                     result.status().ToString().c_str());
        return 1;
      }
    }
    // Bytes the kernel must move: target and scores (and indices) read, the
    // gradient written.
    const double bytes = static_cast<double>(target.size() + scores.size() +
                                             indices.size() * 4 + grad.size());
    rows.push_back({c.name, *kernel * 1e3, bytes / *kernel / 1e9,
                    bytes / *kernel / *copy, call * 1e3});
  }
  std::printf("\n%-22s %10s %12s %10s %12s\n", "case", "kernel ms",
              "kernel GB/s", "copy_ratio", "call ms");
  for (const Row& r : rows) {
    std::printf("%-22s %10.3f %12.1f %10.3f %12.2f\n", r.name.c_str(),
                r.kernel_ms, r.kernel_gbps, r.copy_ratio, r.call_ms);
  }
  return 0;
}
