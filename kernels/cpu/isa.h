#ifndef KLSERVE_KERNELS_CPU_ISA_H_
#define KLSERVE_KERNELS_CPU_ISA_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// The instruction sets the CPU backend's hot code is compiled for. Every
// build carries all three variants (kernels/cpu/CMakeLists.txt) and picks one
// at start from what the CPU reports; every variant gives the same bits.

namespace klserve::cpu {

enum class Isa {
  kBaseline,  // x86-64-v2 (SSE4.2), no FMA: any x86-64 server CPU
  kAvx2,      // AVX2 + FMA + F16C
  kAvx512,    // AVX-512 F, DQ, BW and VL, with the AVX2 set
};

// "baseline", "avx2" or "avx512", as the --isa flags spell them.
absl::string_view IsaName(Isa isa);

// Whether this CPU, and the OS's saved register state, can run `isa`.
bool CpuRuns(Isa isa);

// The one of three per-variant things that belongs to `isa`.
template <typename T>
const T& ForIsa(Isa isa, const T& baseline, const T& avx2, const T& avx512) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    case Isa::kBaseline:
      break;
  }
  return baseline;
}

// The widest variant this CPU runs.
Isa BestIsa();

// The variant a --isa flag asks for: "auto" (BestIsa), "avx512", "avx2" or
// "baseline". Errors: INVALID_ARGUMENT for any other word, FAILED_PRECONDITION
// for a variant this CPU cannot run; `flag` names the flag in the message.
absl::StatusOr<Isa> ResolveIsa(absl::string_view name,
                               absl::string_view flag = "--isa");

// For programs that hand their other arguments to another parser (Google
// Benchmark, GoogleTest): removes every --isa=WORD from argv and resolves the
// last one, or "auto" when there is none.
absl::StatusOr<Isa> TakeIsaFlag(int& argc, char** argv);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_ISA_H_
