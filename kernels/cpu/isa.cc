#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace klserve::cpu {

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

namespace {

// CPUID leaf 1 itself: clang 14's __builtin_cpu_supports has no "f16c".
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace

bool CpuRuns(Isa isa) {
  // __builtin_cpu_supports also checks that the OS saves the YMM and ZMM
  // state (XGETBV), so a VM that hides AVX-512 state gets AVX2.
  __builtin_cpu_init();
  const bool sse42 =
      __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt");
  const bool avx2 = sse42 && __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma") && HasF16c();
  switch (isa) {
    case Isa::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    case Isa::kAvx2:
      return avx2;
    case Isa::kBaseline:
      break;
  }
  return sse42;
}

Isa BestIsa() {
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (CpuRuns(isa)) return isa;
  }
  return Isa::kBaseline;
}

absl::StatusOr<Isa> ResolveIsa(absl::string_view name, absl::string_view flag) {
  if (name == "auto") return BestIsa();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kBaseline}) {
    if (name != IsaName(isa)) continue;
    if (!CpuRuns(isa)) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, "=", name, ": this CPU cannot run the ", name,
                       " kernels; the best it runs is ", IsaName(BestIsa()),
                       " (--isa=auto picks it)"));
    }
    return isa;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": must be auto, avx512, avx2 or baseline, got \"", name, "\""));
}

absl::StatusOr<Isa> TakeIsaFlag(int& argc, char** argv) {
  constexpr absl::string_view kFlag = "--isa=";
  absl::string_view word = "auto";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (absl::StartsWith(arg, kFlag)) {
      word = arg.substr(kFlag.size());
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return ResolveIsa(word);
}

}  // namespace klserve::cpu
