// The CPU kernels' ISA variants (kernels/cpu/isa.h): choosing one, and the
// same bits from every variant this machine runs, primitive by primitive and
// on whole problems. Variants the CPU cannot run are left out and named.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/half.h"
#include "tests/kernels/test_data.h"
#include "tests/kernels/variant_probe.h"

namespace klserve::testdata {
namespace {

using cpu::Isa;

constexpr Isa kAllIsas[] = {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512};

// The variants this CPU runs, the baseline first; the others are logged.
std::vector<Isa> RunnableIsas() {
  std::vector<Isa> isas;
  for (Isa isa : kAllIsas) {
    if (cpu::CpuRuns(isa)) {
      isas.push_back(isa);
    } else {
      std::printf("this CPU cannot run the %s variant: not compared\n",
                  std::string(cpu::IsaName(isa)).c_str());
    }
  }
  return isas;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
uint64_t Bits(double d) { return std::bit_cast<uint64_t>(d); }

TEST(IsaVariants, FlagWordsResolve) {
  ASSERT_TRUE(cpu::CpuRuns(Isa::kBaseline));
  absl::StatusOr<Isa> best = cpu::ResolveIsa("auto");
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(*best, cpu::BestIsa());
  EXPECT_TRUE(cpu::CpuRuns(*best));
  for (Isa isa : kAllIsas) {
    const absl::StatusOr<Isa> resolved = cpu::ResolveIsa(cpu::IsaName(isa));
    if (cpu::CpuRuns(isa)) {
      ASSERT_TRUE(resolved.ok()) << resolved.status();
      EXPECT_EQ(*resolved, isa);
    } else {
      EXPECT_EQ(resolved.status().code(),
                absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(resolved.status().message().find("this CPU cannot run"),
                std::string::npos)
          << resolved.status();
    }
  }
  const absl::StatusOr<Isa> bad = cpu::ResolveIsa("sse9", "--cpu_isa");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--cpu_isa"), std::string::npos);
  EXPECT_NE(bad.status().message().find("sse9"), std::string::npos);
}

TEST(IsaVariants, BackendNamesItsVariantAndItsBlasKernels) {
  // OpenBLAS is installed wherever the tests run (scripts/klserve.sh).
  ASSERT_TRUE(cpu::LoadBlas().ok());
  const std::string blas = ", OpenBLAS " + cpu::BlasCoreName();
  ASSERT_NE(cpu::BlasCoreName(), "");
  for (Isa isa : RunnableIsas()) {
    EXPECT_EQ(
        CpuBackend(1, isa).device(),
        "1 thread, " + std::string(cpu::IsaName(isa)) + " kernels" + blas);
    EXPECT_EQ(
        CpuBackend(2, isa).device(),
        "2 threads, " + std::string(cpu::IsaName(isa)) + " kernels" + blas);
  }
}

// Random floats over the whole range (signs, exponents, subnormals), plus
// the cases where rounding once differs from rounding twice: products that
// nearly cancel c, products on a float midpoint with a c far below them
// (rounded to double first, the sum would sit on the midpoint and round to
// even), and results among the subnormals.
struct FmaInputs {
  std::vector<float> a, b, c;
};

FmaInputs MakeFmaInputs(int64_t n) {
  FmaInputs in;
  std::mt19937_64 rng(11);
  const auto any_float = [&] {
    float f;
    do {
      f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    } while (!std::isfinite(f));
    return f;
  };
  const auto near_one = [&] {
    return 1.0f +
           static_cast<float>(static_cast<int32_t>(rng() % 4096) - 2048) *
               0x1p-23f;
  };
  for (int64_t i = 0; i < n; ++i) {
    float a, b, c;
    switch (i % 7) {
      case 0:  // anything
        a = any_float(), b = any_float(), c = any_float();
        break;
      case 1: {  // moderate exponents, so products and c overlap
        std::uniform_real_distribution<float> u(-4, 4);
        a = std::ldexp(u(rng), int(rng() % 40) - 20);
        b = std::ldexp(u(rng), int(rng() % 40) - 20);
        c = std::ldexp(u(rng), int(rng() % 80) - 40);
        break;
      }
      case 2:  // c cancels the product's rounded value
        a = near_one(), b = near_one();
        c = -(a * b);
        break;
      case 3:  // the product's low half exactly at a tie of c's ulp
        a = near_one(), b = near_one();
        c = std::ldexp(near_one(), int(rng() % 8) - 4);
        break;
      case 4: {  // (1 + 2^-12 k)^2 on a midpoint, c just off it
        const float k = static_cast<float>(1 + rng() % 64);
        a = b = std::ldexp(1.0f + k * 0x1p-12f, int(rng() % 20) - 10);
        c = std::ldexp(rng() % 2 ? 1.0f : -1.0f,
                       std::ilogb(a * b) - 40 - int(rng() % 60));
        break;
      }
      case 5: {
        // c a subnormal of an odd step in [2^-(127 + j), 2^-(126 + j)), and
        // a product 2^-150 (1 - x^2) just off half a step: x^2 2^-150 is
        // below half of double's step at c, so a * b + c rounded to double
        // lands on a float midpoint that the exact sum is not on. The
        // midpoint's bit sits 29 + j places up in the double.
        const int j = static_cast<int>(rng() % 16);
        // k^2 < 2^(16 - j) keeps x^2 2^-150 = k^2 2^-196 below 2^-(180 + j).
        const int k_max = std::max(1, (1 << ((16 - j) / 2)) - 1);
        const float x = static_cast<float>(1 + rng() % k_max) * 0x1p-23f;
        const int shift = static_cast<int>(rng() % 40);
        a = std::ldexp(1.0f + x, -75 - shift);
        b = std::ldexp(rng() % 2 ? 1.0f - x : x - 1.0f, -75 + shift);
        const uint32_t top = uint32_t{1} << (22 - j);
        c = std::bit_cast<float>(
            static_cast<uint32_t>((rng() % 2 ? 0x80000000u : 0u) | top | 1u |
                                  (static_cast<uint32_t>(rng()) & (top - 2))));
        break;
      }
      default: {  // products among the subnormals
        a = std::ldexp(near_one(), -70 - int(rng() % 10));
        b = std::ldexp(near_one(), -60 - int(rng() % 10));
        c = std::ldexp(rng() % 2 ? near_one() : -near_one(),
                       -126 - int(rng() % 20));
        break;
      }
    }
    in.a.push_back(a);
    in.b.push_back(b);
    in.c.push_back(c);
  }
  return in;
}

TEST(IsaVariants, FmaRoundsOnceInEveryVariant) {
  constexpr int64_t kN = 1 << 20;
  const FmaInputs in = MakeFmaInputs(kN);
  std::vector<float> out(kN);
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(std::string(cpu::IsaName(isa)));
    const VariantProbe& probe = ProbeFor(isa);
    for (int64_t i = 0; i < kN; i += 16) {
      probe.fma(&in.a[i], &in.b[i], &in.c[i], &out[i]);
    }
    for (int64_t i = 0; i < kN; ++i) {
      const float want = std::fma(in.a[i], in.b[i], in.c[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i])) << i;
        continue;
      }
      ASSERT_EQ(Bits(out[i]), Bits(want)) << i << ": fma(" << in.a[i] << ", "
                                          << in.b[i] << ", " << in.c[i] << ")";
    }
  }
}

TEST(IsaVariants, MultiplyAndAddAreNotFusedInAnyVariant) {
  // a * b = 1 + 2^-11 + 2^-24 exactly, which float32 rounds (a tie, to even)
  // to 1 + 2^-11; adding c then gives 0. Fused, it gives 2^-24.
  const float a = 1.0f + 0x1p-12f, b = a, c = -(1.0f + 0x1p-11f);
  ASSERT_EQ(std::fma(a, b, c), 0x1p-24f);
  for (Isa isa : RunnableIsas()) {
    EXPECT_EQ(ProbeFor(isa).mul_add(a, b, c), 0.0f)
        << cpu::IsaName(isa) << ": a * b + c was fused";
  }
}

// exp and log: the same bits in every variant, and close to libm's.
TEST(IsaVariants, ExpAndLogGiveTheSameBits) {
  std::vector<float> x;
  for (float v = -104.0f; v < 90.0f; v += 0.0137f) x.push_back(v);
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += 0x3f01u) {
    x.push_back(std::bit_cast<float>(bits));  // subnormals and 0 included
  }
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.resize((x.size() + 15) / 16 * 16, 1.0f);
  struct Out {
    std::vector<float> exp, exponent, mantissa_log;
  };
  const auto run = [&](const VariantProbe& probe) {
    Out out{std::vector<float>(x.size()), std::vector<float>(x.size()),
            std::vector<float>(x.size())};
    for (size_t i = 0; i < x.size(); i += 16) {
      probe.exp(&x[i], &out.exp[i]);
      probe.log_split(&x[i], &out.exponent[i], &out.mantissa_log[i]);
    }
    return out;
  };
  const std::vector<Isa> isas = RunnableIsas();
  const Out first = run(ProbeFor(isas[0]));
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::exp(double{x[i]});
    if (e > 1e-37 && x[i] <= 88.0f) {  // the probe caps Exp's input at 88
      ASSERT_NEAR(first.exp[i], e, 4e-7 * e) << x[i];
    }
    if (x[i] > 0 && std::isfinite(x[i])) {
      const double l = std::log(double{x[i]});
      const double split =
          first.exponent[i] * std::numbers::ln2 + double{first.mantissa_log[i]};
      ASSERT_NEAR(split, l, 4e-8 * std::max(1.0, std::abs(l))) << x[i];
    }
  }
  for (size_t k = 1; k < isas.size(); ++k) {
    SCOPED_TRACE(std::string(cpu::IsaName(isas[k])));
    const Out other = run(ProbeFor(isas[k]));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(Bits(other.exp[i]), Bits(first.exp[i])) << x[i];
      ASSERT_EQ(Bits(other.exponent[i]), Bits(first.exponent[i])) << x[i];
      ASSERT_EQ(Bits(other.mantissa_log[i]), Bits(first.mantissa_log[i]))
          << x[i];
    }
  }
}

// Each variant's row conversions against kernels/half.h's scalar ones, on
// every 16-bit pattern, at an odd byte offset and a length with a tail.
TEST(IsaVariants, RowConversionsMatchTheScalarOnes) {
  constexpr int64_t kN = 65536 - 3;
  std::vector<std::byte> halves(2 * kN + 1);
  for (int64_t i = 0; i < kN; ++i) {
    const uint16_t h =
        static_cast<uint16_t>(i * 7 + 3);  // 7 is odd: a permutation
    std::memcpy(&halves[1 + 2 * i], &h, 2);
  }
  std::vector<float> floats;
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += 4099) {
    floats.push_back(std::bit_cast<float>(static_cast<uint32_t>(i)));
  }
  for (float f : {0.0f, -0.0f, 65520.0f, 0x1p-25f, 1e-45f}) floats.push_back(f);
  const int64_t m = static_cast<int64_t>(floats.size());
  for (Isa isa : RunnableIsas()) {
    SCOPED_TRACE(std::string(cpu::IsaName(isa)));
    const VariantProbe& probe = ProbeFor(isa);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      float (*const widen)(uint16_t) =
          dtype == DType::kFloat16 ? Float16ToFloat : BFloat16ToFloat;
      uint16_t (*const narrow)(float) =
          dtype == DType::kFloat16 ? FloatToFloat16 : FloatToBFloat16;
      std::vector<float> scratch(kN);
      const float* row = probe.float_row(dtype, &halves[1], kN, scratch.data());
      for (int64_t i = 0; i < kN; ++i) {
        uint16_t h;
        std::memcpy(&h, &halves[1 + 2 * i], 2);
        ASSERT_EQ(Bits(row[i]), Bits(widen(h))) << std::hex << h;
      }
      std::vector<std::byte> out(2 * m + 1);
      probe.store_float_row(floats.data(), m, dtype, &out[1]);
      for (int64_t i = 0; i < m; ++i) {
        uint16_t h;
        std::memcpy(&h, &out[1 + 2 * i], 2);
        ASSERT_EQ(h, narrow(floats[i])) << std::hex << Bits(floats[i]);
      }
    }
  }
}

void ExpectSameBytes(const LibOutput& want, const LibOutput& got) {
  ASSERT_EQ(got.status, want.status);
  const IndexerKlResult& a = want.result;
  const IndexerKlResult& b = got.result;
  EXPECT_EQ(Bits(b.loss), Bits(a.loss));
  EXPECT_EQ(Bits(b.unscaled_loss), Bits(a.unscaled_loss));
  EXPECT_EQ(Bits(b.kl_sum), Bits(a.kl_sum));
  EXPECT_EQ(b.denominator, a.denominator);
  EXPECT_EQ(b.rows_counted, a.rows_counted);
  ASSERT_EQ(b.diagnostics.has_value(), a.diagnostics.has_value());
  if (a.diagnostics.has_value()) {
    EXPECT_EQ(Bits(b.diagnostics->mean_entropy_p),
              Bits(a.diagnostics->mean_entropy_p));
    EXPECT_EQ(Bits(b.diagnostics->mean_entropy_q),
              Bits(a.diagnostics->mean_entropy_q));
    EXPECT_EQ(b.diagnostics->topk_recall.has_value(),
              a.diagnostics->topk_recall.has_value());
    if (a.diagnostics->topk_recall.has_value()) {
      EXPECT_EQ(Bits(*b.diagnostics->topk_recall),
                Bits(*a.diagnostics->topk_recall));
    }
  }
  EXPECT_TRUE(got.grad_bytes == want.grad_bytes) << "gradient bytes differ";
  ASSERT_EQ(got.row_kl.size(), want.row_kl.size());
  for (size_t i = 0; i < want.row_kl.size(); ++i) {
    ASSERT_EQ(Bits(got.row_kl[i]), Bits(want.row_kl[i])) << "row " << i;
  }
}

// The reference suite's random problems (every form, dtype, mask, flavour
// and reduction), and long rows of every form: each variant's bytes equal
// the baseline's.
TEST(IsaVariants, EveryVariantGivesTheSameBytes) {
  const std::vector<Isa> isas = RunnableIsas();
  std::vector<CaseSpec> specs;
  std::mt19937_64 rng(20251130);
  for (int i = 0; i < 300; ++i) specs.push_back(RandomSpec(rng));
  for (int64_t S : {15, 16, 17, 33, 257, 1000}) {
    for (InputForm form : kInputFormsByTarget) {
      CaseSpec spec;
      spec.B = 2, spec.T = 9, spec.S = S, spec.H = 3, spec.K = S - 1;
      spec.form = form;
      spec.causal = true;
      spec.key_padding = (S % 2) == 1;
      spec.target_dtype = S % 3 == 0 ? DType::kBFloat16 : DType::kFloat32;
      spec.scores_dtype = S % 3 == 1 ? DType::kFloat16 : DType::kFloat32;
      spec.options.flavor = IsSparse(form) ? Flavor::kMaxText : Flavor::kExact;
      specs.push_back(spec);
    }
  }
  // Scores past kShiftedCrossTermAbove, where the EXACT KL's cross term is
  // summed after the maximum (ShiftedScoreSum), with and without the
  // diagnostics' sum in the same pass.
  for (double spread : {1e4, 1e20}) {
    for (InputForm form : kInputFormsByTarget) {
      CaseSpec spec;
      spec.B = 2, spec.T = 5, spec.S = 257, spec.H = 3, spec.K = 200;
      spec.form = form;
      spec.causal = true;
      spec.score_spread = spread;
      spec.options.flavor = Flavor::kExact;
      spec.options.want_diagnostics = spread > 1e10;
      specs.push_back(spec);
    }
  }
  std::vector<std::unique_ptr<CpuBackend>> backends;
  for (Isa isa : isas) backends.push_back(std::make_unique<CpuBackend>(2, isa));
  uint64_t seed = 5000;
  for (const CaseSpec& spec : specs) {
    SCOPED_TRACE(Describe(spec) + " seed=" + std::to_string(seed));
    const Case c = MakeRandomCase(spec, seed++);
    const LibOutput want = RunLibrary(c, backends[0].get());
    for (size_t k = 1; k < backends.size(); ++k) {
      SCOPED_TRACE(std::string(cpu::IsaName(isas[k])) + " against " +
                   std::string(cpu::IsaName(isas[0])));
      ExpectSameBytes(want, RunLibrary(c, backends[k].get()));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace klserve::testdata
