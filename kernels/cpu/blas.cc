#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <cpuid.h>
#include <dlfcn.h>

#include <cstdlib>
#include <initializer_list>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/cpu/isa.h"

namespace klserve::cpu {
namespace {

// The CBLAS soname Debian's libopenblas0 packages provide (pthread, openmp
// or serial build, by update-alternatives).
constexpr char kLibrary[] = "libopenblas.so.0";

struct Blas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_get_corename) corename = nullptr;
  absl::Status status;
};

Blas& TheBlas() {
  static Blas blas;
  return blas;
}

// What OpenBLAS's kernel set `kernels` needs beyond x86-64-v2 that this CPU
// lacks, or "" when it runs them. OpenBLAS runs what OPENBLAS_CORETYPE names
// without asking the CPU, so kernels it cannot run would end the first
// product with SIGILL, after the server had reported itself healthy.
std::string MissingForKernels(absl::string_view kernels) {
  const auto named = [&](std::initializer_list<absl::string_view> names) {
    for (absl::string_view name : names) {
      if (absl::EqualsIgnoreCase(kernels, name)) return true;
    }
    return false;
  };
  __builtin_cpu_init();
  if (named({"SkylakeX", "Cooperlake", "SapphireRapids"})) {
    return CpuRuns(Isa::kAvx512) ? "" : "AVX-512 (F, DQ, BW, VL)";
  }
  if (named({"Haswell", "Zen"})) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
               ? ""
               : "AVX2 and FMA";
  }
  if (named({"Sandybridge"})) {
    return __builtin_cpu_supports("avx") ? "" : "AVX";
  }
  // AMD's Bulldozer family, which alone has FMA4.
  if (named({"Bulldozer", "Piledriver", "Steamroller", "Excavator"})) {
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma4")
               ? ""
               : "AVX and FMA4";
  }
  // Old AMD kernels with 3DNow! (femms), which no x86-64-v2 CPU has.
  if (named({"Opteron", "Opteron_SSE3"})) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool has_3dnow = __get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx) &&
                           (edx & (1u << 31)) != 0;
    return has_3dnow ? "" : "3DNow!";
  }
  // The rest need no more than x86-64-v2, or are names this file does not
  // know (a later OpenBLAS's), which OpenBLAS picked for this CPU itself.
  return "";
}

void Load() {
  Blas& blas = TheBlas();
  // Read by the library when it loads; one thread per product, always.
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1);
  // OpenBLAS picks its kernels by CPU, and they sum in different orders (its
  // AVX-512 kernels against its AVX2 ones), so replicas on different CPUs
  // would answer the projections form with different bits. Every CPU with
  // AVX2 and FMA runs its Haswell kernels: the same bits everywhere, at some
  // cost in speed on CPUs with full-width AVX-512 (docs/blas.md). An
  // operator's own OPENBLAS_CORETYPE stays; an empty one, which OpenBLAS
  // ignores, does not.
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (CpuRuns(Isa::kAvx2) && (coretype == nullptr || *coretype == '\0')) {
    setenv("OPENBLAS_CORETYPE", "Haswell", /*overwrite=*/1);
  }
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    blas.status = absl::FailedPreconditionError(absl::StrCat(
        "query: the projections form needs OpenBLAS (", kLibrary,
        ", Debian's libopenblas0), which did not load: ", dlerror()));
    return;
  }
  blas.sgemm =
      reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(library, "cblas_sgemm"));
  blas.corename = reinterpret_cast<decltype(&openblas_get_corename)>(
      dlsym(library, "openblas_get_corename"));
  if (blas.sgemm == nullptr || blas.corename == nullptr) {
    blas.status =
        absl::FailedPreconditionError(absl::StrCat("query: ", kLibrary,
                                                   " has no cblas_sgemm or "
                                                   "openblas_get_corename"));
    return;
  }
  const std::string kernels = blas.corename();
  if (const std::string missing = MissingForKernels(kernels);
      !missing.empty()) {
    const char* asked = std::getenv("OPENBLAS_CORETYPE");
    blas.status = absl::FailedPreconditionError(absl::StrCat(
        "query: OpenBLAS would run its ", kernels, " kernels (",
        asked == nullptr ? "its own choice"
                         : absl::StrCat("OPENBLAS_CORETYPE=", asked),
        "), which need ", missing,
        " that this CPU lacks; unset OPENBLAS_CORETYPE or name kernels "
        "every replica's CPU runs (docs/blas.md)"));
  }
}

}  // namespace

absl::Status LoadBlas() {
  static std::once_flag once;
  std::call_once(once, Load);
  return TheBlas().status;
}

std::string BlasCoreName() {
  return LoadBlas().ok() ? TheBlas().corename() : "";
}

std::string BlasKernels() {
  if (absl::Status status = LoadBlas(); !status.ok()) {
    // Its message is a request's error, which names the field.
    return absl::StrCat("refused: ",
                        absl::StripPrefix(status.message(), "query: "));
  }
  const std::string kernels = TheBlas().corename();
  // OpenBLAS takes a name it does not know (a typo) as none and picks by
  // CPU, and runs others for a few old names: either way the kernels an
  // operator meant to pin are not the ones that run, which the log says.
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked != nullptr && !absl::EqualsIgnoreCase(asked, kernels)) {
    return absl::StrCat("OpenBLAS, ", kernels,
                        " kernels, not the OPENBLAS_CORETYPE=\"", asked,
                        "\" asked for (a name OpenBLAS does not know, or one "
                        "it runs these for)");
  }
  return absl::StrCat("OpenBLAS, ", kernels, " kernels");
}

void Sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  TheBlas().sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                  transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                  lda, b, ldb, beta, c, ldc);
}

}  // namespace klserve::cpu
