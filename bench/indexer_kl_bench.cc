// klserve_bench: times ComputeIndexerKl on the CPU backend for each input form
// on DeepSeek-V3.2-sized rows, and states every figure as a ratio to two
// ceilings measured at startup, in the same process, on as many threads as
// the backend uses:
//
//   copy_ratio = bytes/s (target, scores and indices read + gradient written)
//                / STREAM-style copy bandwidth (read + write bytes/s)
//   exp_ratio  = elements/s / throughput of a vectorised exp loop (exps/s)
//
// Elements are the logits for a per-head target and the target's elements
// otherwise. The machines are shared and noisy: compare ratios from one run,
// not absolute times across runs. Method and results: docs/PERFORMANCE.md.
//
// Flags: --klserve_threads=N (default 0: every core), --klserve_queries=N
// (default 0: each case's own), --isa=auto|avx512|avx2|baseline (the CPU
// kernels' variant, kernels/cpu/isa.h), then Google Benchmark's own
// (--benchmark_filter, --benchmark_min_time=0.2, ...).

#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/parallel_timing.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/dtype.h"
#include "kernels/half.h"
#include "kernels/loss.h"
#include "kernels/problem.h"
#include "kernels/tensor_view.h"

namespace klserve {
namespace {

using bench::BestParallelSeconds;

using Clock = std::chrono::steady_clock;

// The one backend of the process, and the ceilings measured on its threads.
CpuBackend* g_backend = nullptr;

struct Ceilings {
  int threads = 0;
  double copy_bytes_per_s = 0;  // read + write bytes
  double exps_per_s = 0;
};
Ceilings g_ceilings;

// dst = src with ordinary 16-byte vector stores, n a multiple of 4. Not
// memcpy: glibc's large-copy path uses non-temporal stores, a different
// ceiling (about 1.5x higher on these machines, shared/notes/toolchain.md)
// than the ordinary stores the kernels write their gradients with. The
// loads and stores hide behind an empty asm so that the compiler cannot turn
// the loop back into memcpy.
void CopyFloats(const float* src, float* dst, int64_t n) {
  using Vec4 = float __attribute__((vector_size(16), aligned(4)));
  for (int64_t i = 0; i < n; i += 4) {
    Vec4 v = *reinterpret_cast<const Vec4*>(src + i);
    asm("" : "+x"(v));
    *reinterpret_cast<Vec4*>(dst + i) = v;
  }
}

// STREAM-style copy of one 256 MiB buffer into another, split in equal
// slices across the threads; counts the bytes read plus the bytes written.
double MeasureCopyBandwidth(int threads) {
  constexpr int64_t kBytes = int64_t{256} << 20;
  constexpr int64_t n = kBytes / sizeof(float);
  const int64_t slice = (n / threads) & ~int64_t{63};
  const auto range = [&](int i) {
    const int64_t begin = i * slice;
    return std::make_pair(begin, i == threads - 1 ? n - begin : slice);
  };
  std::unique_ptr<float[]> a(new float[n]);
  std::unique_ptr<float[]> b(new float[n]);
  // Each thread first touches the pages it will copy.
  BestParallelSeconds(threads, 1, [&](int i) {
    const auto [begin, count] = range(i);
    std::fill_n(a.get() + begin, count, 1.0f);
    std::fill_n(b.get() + begin, count, 0.0f);
  });
  const double seconds = BestParallelSeconds(threads, 10, [&](int i) {
    const auto [begin, count] = range(i);
    CopyFloats(a.get() + begin, b.get() + begin, count);
  });
  return 2.0 * kBytes / seconds;
}

// The kernels' own exp, of the backend's ISA variant, over an L1-resident
// buffer on every thread, values in the range a softmax feeds it (x - max in
// [-20, 0]).
double MeasureExpThroughput(int threads, const cpu::IsaKernels& kernels) {
  constexpr int64_t kN = 2048;  // 8 KiB in + 8 KiB out per thread
  constexpr int64_t kPasses = 10000;
  struct alignas(64) Buffers {
    float in[kN];
    float out[kN];
  };
  std::vector<std::unique_ptr<Buffers>> buffers;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> uniform(-20.0f, 0.0f);
  for (int i = 0; i < threads; ++i) {
    buffers.push_back(std::make_unique<Buffers>());
    for (float& x : buffers.back()->in) x = uniform(gen);
  }
  const double seconds = BestParallelSeconds(threads, 30, [&](int i) {
    Buffers& buf = *buffers[i];
    for (int64_t pass = 0; pass < kPasses; ++pass) {
      kernels.exp(buf.in, buf.out, kN);
      // Keeps the compiler from merging or dropping passes.
      asm volatile("" : : "r"(buf.out) : "memory");
    }
  });
  return double(threads) * kN * kPasses / seconds;
}

Ceilings MeasureCeilings(const CpuBackend& backend) {
  Ceilings ceilings;
  ceilings.threads = backend.threads();
  ceilings.copy_bytes_per_s = MeasureCopyBandwidth(ceilings.threads);
  ceilings.exps_per_s =
      MeasureExpThroughput(ceilings.threads, backend.kernels());
  return ceilings;
}

// ---------------------------------------------------------------------------
// The benchmarked problems.

struct Case {
  // Per-head: attention_logits [B,H,T,K]; aggregated: weights [B,T,K].
  InputForm form = InputForm::kDenseAggregated;
  DType dtype = DType::kFloat32;  // target, scores and gradient
  int64_t B = 1, H = 1, T = 0, S = 0;
  int64_t K = 0;  // slots per row: S in the dense stage
  bool causal = false;
  Flavor flavor = Flavor::kExact;
};

std::string CaseName(const Case& c) {
  std::string name = std::string(InputFormName(c.form)) + "_";
  name += c.dtype == DType::kBFloat16 ? "bf16" : "fp32";
  if (c.causal) name += "_causal";
  if (c.flavor == Flavor::kMaxText) name += "_maxtext";
  name += "/B" + std::to_string(c.B);
  if (IsPerHead(c.form)) name += "_H" + std::to_string(c.H);
  name += "_T" + std::to_string(c.T) + "_S" + std::to_string(c.S);
  if (IsSparse(c.form)) name += "_K" + std::to_string(c.K);
  return name;
}

// Normal deviates fast enough to fill a gigabyte: a table of 2^16 exact
// N(0,1) samples indexed by a xorshift generator.
class FastNormal {
 public:
  explicit FastNormal(uint64_t seed)
      : table_(1 << 16), state_(seed * 0x9E3779B97F4A7C15ull | 1) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal;
    for (float& v : table_) v = normal(gen);
  }
  uint64_t Bits() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  float Normal() { return table_[Bits() >> 48]; }
  // Uniform in [0, n), n < 2^32.
  int64_t Below(int64_t n) {
    return int64_t(((Bits() >> 32) * uint64_t(n)) >> 32);
  }

 private:
  std::vector<float> table_;
  uint64_t state_;
};

void Put(DType dtype, std::byte* base, int64_t i, float v) {
  if (dtype == DType::kBFloat16) {
    const uint16_t bits = FloatToBFloat16(v);
    std::memcpy(base + 2 * i, &bits, 2);
  } else {
    std::memcpy(base + 4 * i, &v, 4);
  }
}

std::unique_ptr<std::byte[]> Allocate(int64_t bytes) {
  return std::unique_ptr<std::byte[]>(new std::byte[bytes]);
}

TensorView View(DType dtype, std::initializer_list<int64_t> shape,
                const std::byte* data, int64_t byte_size) {
  TensorView view;
  view.dtype = dtype;
  view.shape.assign(shape.begin(), shape.end());
  view.data = data;
  view.byte_size = byte_size;
  return view;
}

// One case's data and validated problem, built once and reused by every run
// of that case.
struct Fixture {
  const Case* source = nullptr;
  std::unique_ptr<std::byte[]> target, scores, indices, grad;
  int64_t target_bytes = 0, scores_bytes = 0, indices_bytes = 0;
  int64_t grad_bytes = 0;
  absl::StatusOr<IndexerKlProblem> problem;
  absl::StatusOr<RowData> rows;  // of all rows, once the problem is valid
  LossOutputs outputs;

  int64_t bytes_moved() const {
    return target_bytes + scores_bytes + indices_bytes + grad_bytes;
  }
};

std::unique_ptr<Fixture> MakeFixture(const Case& c) {
  auto f = std::make_unique<Fixture>();
  f->source = &c;
  FastNormal rng(42);
  const int64_t rows = c.B * c.T;
  const int64_t esize = DTypeSize(c.dtype);

  // Indexer scores ~ N(0,1) * 3.
  f->scores_bytes = rows * c.K * esize;
  f->scores = Allocate(f->scores_bytes);
  for (int64_t i = 0; i < rows * c.K; ++i) {
    Put(c.dtype, f->scores.get(), i, 3.0f * rng.Normal());
  }

  if (IsPerHead(c.form)) {
    // Per-head logits ~ N(0,1) * 3, already scaled.
    const int64_t n = c.B * c.H * c.T * c.K;
    f->target_bytes = n * esize;
    f->target = Allocate(f->target_bytes);
    for (int64_t i = 0; i < n; ++i) {
      Put(c.dtype, f->target.get(), i, 3.0f * rng.Normal());
    }
  } else {
    // Head-aggregated weights: each row a softmax of N(0,1) * 3 logits, the
    // peaked, positive shape of real attention.
    f->target_bytes = rows * c.K * esize;
    f->target = Allocate(f->target_bytes);
    std::vector<float> row(c.K);
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (float& w : row) {
        w = std::exp(3.0f * rng.Normal());
        sum += w;
      }
      for (int64_t j = 0; j < c.K; ++j) {
        Put(c.dtype, f->target.get(), r * c.K + j, float(row[j] / sum));
      }
    }
  }

  if (IsSparse(c.form)) {
    // Distinct keys in random order, as a top-k of the scores would give.
    // Under the causal mask only keys at or before the query's position are
    // drawn, and a row with fewer such keys than slots ends in -1 slots.
    f->indices_bytes = rows * c.K * int64_t{sizeof(int32_t)};
    f->indices = Allocate(f->indices_bytes);
    const int64_t q_offset = c.S - c.T;
    std::vector<int32_t> row(c.K);
    std::vector<uint8_t> taken(c.S, 0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % c.T;
      const int64_t n = c.causal ? std::min(c.S, t + q_offset + 1) : c.S;
      const int64_t m = std::min(c.K, n);
      // Floyd's sampling of m distinct keys from [0, n), then a shuffle.
      int64_t count = 0;
      for (int64_t j = n - m; j < n; ++j) {
        int64_t key = rng.Below(j + 1);
        if (taken[key]) key = j;
        taken[key] = 1;
        row[count++] = int32_t(key);
      }
      for (int64_t j = m - 1; j > 0; --j)
        std::swap(row[j], row[rng.Below(j + 1)]);
      for (int64_t j = 0; j < m; ++j) taken[row[j]] = 0;
      std::fill(row.begin() + m, row.end(), -1);
      std::memcpy(f->indices.get() + r * c.K * sizeof(int32_t), row.data(),
                  c.K * sizeof(int32_t));
    }
  }

  f->grad_bytes = rows * c.K * esize;
  f->grad = Allocate(f->grad_bytes);
  std::memset(f->grad.get(), 0, f->grad_bytes);
  f->outputs.grad = f->grad.get();
  f->outputs.grad_byte_size = f->grad_bytes;

  IndexerKlInputs inputs;
  inputs.indexer_scores =
      View(c.dtype, {c.B, c.T, c.K}, f->scores.get(), f->scores_bytes);
  if (IsPerHead(c.form)) {
    inputs.attention_logits =
        View(c.dtype, {c.B, c.H, c.T, c.K}, f->target.get(), f->target_bytes);
  } else {
    inputs.attention_weights =
        View(c.dtype, {c.B, c.T, c.K}, f->target.get(), f->target_bytes);
  }
  if (IsSparse(c.form)) {
    inputs.topk_indices = View(DType::kInt32, {c.B, c.T, c.K}, f->indices.get(),
                               f->indices_bytes);
  }
  IndexerKlOptions options;
  options.causal = c.causal;
  options.num_keys = c.S;
  options.flavor = c.flavor;
  options.scaling_factor = 0.01;  // what training runs use
  options.grad_dtype = c.dtype;
  f->problem = IndexerKlProblem::Create(inputs, options);
  f->rows = f->problem.ok() ? WholeRowData(*f->problem, inputs)
                            : absl::StatusOr<RowData>(f->problem.status());
  return f;
}

// The fixture of `c`, building it (and freeing the previous case's) when the
// case changes: Google Benchmark calls a case several times while it settles
// the iteration count, and the data must not be rebuilt or timed.
Fixture& GetFixture(const Case& c) {
  static std::unique_ptr<Fixture> current;
  if (current == nullptr || current->source != &c) {
    current.reset();
    current = MakeFixture(c);
  }
  return *current;
}

void BM_IndexerKl(benchmark::State& state, const Case& c) {
  Fixture& f = GetFixture(c);
  if (!f.rows.ok()) {  // the problem's error, when it is not valid
    state.SkipWithError(f.rows.status().ToString().c_str());
    return;
  }
  // Each iteration is timed by hand (tens of milliseconds or more, so the
  // clock costs nothing): the ratios below are then plain numbers over the
  // very time the benchmark reports.
  double seconds = 0;
  double best = 1e300;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<IndexerKlResult> result =
        ComputeIndexerKl(*g_backend, *f.problem, *f.rows, f.outputs);
    const double elapsed =
        std::chrono::duration<double>(Clock::now() - start).count();
    state.SetIterationTime(elapsed);
    seconds += elapsed;
    best = std::min(best, elapsed);
    if (!result.ok()) {
      state.SkipWithError(result.status().ToString().c_str());
      break;
    }
    if (!std::isfinite(result->loss) || result->loss < 0) {
      state.SkipWithError("loss is negative or not finite");
      break;
    }
    benchmark::DoNotOptimize(result->loss);
  }
  if (seconds <= 0) return;
  const double iterations = double(state.iterations());
  const double bytes = iterations * double(f.bytes_moved());
  const double items =
      iterations * double(c.B * c.T * c.K * (IsPerHead(c.form) ? c.H : 1));
  state.SetBytesProcessed(int64_t(bytes));
  state.SetItemsProcessed(int64_t(items));
  // The ratios use the fastest iteration, as the ceilings use their fastest
  // repetition: on a shared machine interference only ever slows a run down,
  // so best against best compares what the code and the machine can do.
  state.counters["copy_ratio"] =
      bytes / iterations / best / g_ceilings.copy_bytes_per_s;
  state.counters["exp_ratio"] =
      items / iterations / best / g_ceilings.exps_per_s;
  state.counters["best_ms"] = best * 1e3;
}

// --klserve_queries=N: every case with N query rows in place of its own,
// few enough to keep a case in cache, where it shows its work per element
// without the memory's share (docs/PERFORMANCE.md).
int g_queries = 0;

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const auto add = [&](Case c) {
    if (g_queries > 0) c.T = g_queries;
    if (!IsSparse(c.form)) c.K = c.S;
    cases.push_back(c);
  };
  // Dense warm-up stage, 4K context (DeepSeek-V3.2's example length).
  add({.T = 4096, .S = 4096});
  add({.dtype = DType::kBFloat16, .T = 4096, .S = 4096});
  add({.T = 4096, .S = 4096, .causal = true});
  add({.T = 4096, .S = 4096, .flavor = Flavor::kMaxText});
  add({.form = InputForm::kDensePerHead, .H = 16, .T = 4096, .S = 4096});
  add({.form = InputForm::kDensePerHead,
       .dtype = DType::kBFloat16,
       .H = 16,
       .T = 4096,
       .S = 4096});
  // Sparse stage, k = 2048 of 4096 keys.
  add({.form = InputForm::kSparseAggregated, .T = 4096, .S = 4096, .K = 2048});
  add({.form = InputForm::kSparseAggregated,
       .T = 4096,
       .S = 4096,
       .K = 2048,
       .causal = true});
  add({.form = InputForm::kSparsePerHead,
       .H = 16,
       .T = 1024,
       .S = 4096,
       .K = 2048});
  return cases;
}

// ---------------------------------------------------------------------------
// Output: the console table as usual, then a summary of the ratios.

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(bool color)
      : ConsoleReporter(color ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      // With --benchmark_repetitions the median stands for the case.
      if (run.error_occurred) continue;
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") {
        continue;
      }
      const std::string& name = run.run_name.function_name;
      if (!rows_.contains(name)) order_.push_back(name);
      Row& row = rows_[name];
      row.ms_per_iter = run.GetAdjustedRealTime();
      row.best_ms = Get(run, "best_ms");
      row.copy_ratio = Get(run, "copy_ratio");
      row.exp_ratio = Get(run, "exp_ratio");
    }
    ConsoleReporter::ReportRuns(runs);
  }

  // `after` is the ceilings measured again once the cases have run: a large
  // drift means something else shared the machine and the ratios are suspect.
  void PrintSummary(const Ceilings& after) const {
    const double copy_drift =
        after.copy_bytes_per_s / g_ceilings.copy_bytes_per_s - 1;
    const double exp_drift = after.exps_per_s / g_ceilings.exps_per_s - 1;
    std::printf(
        "\nklserve_bench summary: %s kernels, %d threads; ceilings at start: "
        "copy %.1f "
        "GB/s (read + write), exp %.2f G/s; at end: %.1f GB/s (%+.0f%%), "
        "%.2f G/s (%+.0f%%)\n",
        std::string(cpu::IsaName(g_backend->kernels().isa)).c_str(),
        g_ceilings.threads, g_ceilings.copy_bytes_per_s / 1e9,
        g_ceilings.exps_per_s / 1e9, after.copy_bytes_per_s / 1e9,
        100 * copy_drift, after.exps_per_s / 1e9, 100 * exp_drift);
    if (std::abs(copy_drift) > 0.1 || std::abs(exp_drift) > 0.1) {
      std::printf(
          "warning: the ceilings moved by more than 10%% during the run; the "
          "machine was busy, so rerun before trusting the ratios\n");
    }
    // GB/s, Gelem/s and the ratios are those of the fastest iteration.
    std::printf("%-44s %8s %8s %8s %10s %9s %9s\n", "case", "mean ms",
                "best ms", "GB/s", "copy_ratio", "Gelem/s", "exp_ratio");
    for (const std::string& name : order_) {
      const Row& row = rows_.at(name);
      std::printf("%-44s %8.2f %8.2f %8.2f %10.3f %9.3f %9.3f\n", name.c_str(),
                  row.ms_per_iter, row.best_ms,
                  row.copy_ratio * g_ceilings.copy_bytes_per_s / 1e9,
                  row.copy_ratio, row.exp_ratio * g_ceilings.exps_per_s / 1e9,
                  row.exp_ratio);
    }
    std::fflush(stdout);
  }

 private:
  struct Row {
    double ms_per_iter = 0, best_ms = 0;
    double copy_ratio = 0, exp_ratio = 0;
  };
  static double Get(const Run& run, const std::string& key) {
    const auto it = run.counters.find(key);
    return it == run.counters.end() ? 0.0 : it->second.value;
  }
  std::vector<std::string> order_;
  std::map<std::string, Row> rows_;
};

// Removes --klserve_<name>=N from argv and returns N (0 when absent).
int TakeIntFlag(int& argc, char** argv, std::string_view name) {
  const std::string flag = "--klserve_" + std::string(name) + "=";
  int value = 0;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with(flag)) {
      value = std::atoi(argv[i] + flag.size());
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return value;
}

bool HasArg(int argc, char** argv, std::string_view prefix) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with(prefix)) return true;
  }
  return false;
}

int Main(int argc, char** argv) {
  const int threads = TakeIntFlag(argc, argv, "threads");
  g_queries = TakeIntFlag(argc, argv, "queries");
  const absl::StatusOr<cpu::Isa> isa = cpu::TakeIsaFlag(argc, argv);
  if (!isa.ok()) {
    std::fprintf(stderr, "klserve_bench: %s\n",
                 std::string(isa.status().message()).c_str());
    return 2;
  }
  // JSON or CSV on stdout must stay machine-readable: no summary then.
  const bool console = !HasArg(argc, argv, "--benchmark_format=") ||
                       HasArg(argc, argv, "--benchmark_format=console");
  const bool listing = HasArg(argc, argv, "--benchmark_list_tests");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  CpuBackend backend(threads, *isa);
  g_backend = &backend;
  const std::string isa_name(cpu::IsaName(*isa));
  if (!listing) {
    g_ceilings = MeasureCeilings(backend);
    std::fprintf(stderr,
                 "%s kernels; ceilings on %d threads: copy %.1f GB/s (read + "
                 "write, 256 MiB buffers), exp %.2f G/s (L1-resident)\n",
                 isa_name.c_str(), g_ceilings.threads,
                 g_ceilings.copy_bytes_per_s / 1e9,
                 g_ceilings.exps_per_s / 1e9);
    // Recorded with the results, JSON output included.
    benchmark::AddCustomContext("klserve_isa", isa_name);
    benchmark::AddCustomContext("klserve_threads",
                                std::to_string(g_ceilings.threads));
    char text[32];
    std::snprintf(text, sizeof(text), "%.4g", g_ceilings.copy_bytes_per_s);
    benchmark::AddCustomContext("klserve_copy_bytes_per_s", text);
    std::snprintf(text, sizeof(text), "%.4g", g_ceilings.exps_per_s);
    benchmark::AddCustomContext("klserve_exps_per_s", text);
  }

  static const std::vector<Case> cases = Cases();
  for (const Case& c : cases) {
    benchmark::RegisterBenchmark(
        CaseName(c).c_str(),
        [&c](benchmark::State& state) { BM_IndexerKl(state, c); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }

  if (console) {
    SummaryReporter reporter(isatty(STDOUT_FILENO) != 0);
    benchmark::RunSpecifiedBenchmarks(&reporter);
    if (!listing) reporter.PrintSummary(MeasureCeilings(*g_backend));
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace klserve

int main(int argc, char** argv) { return klserve::Main(argc, argv); }
