#ifndef KLSERVE_KERNELS_CPU_VARIANT_ISA_NAMESPACE_H_
#define KLSERVE_KERNELS_CPU_VARIANT_ISA_NAMESPACE_H_

// Everything in kernels/cpu/variant/ is compiled once per ISA variant, each
// time with that ISA's flags and with KLSERVE_ISA naming the variant
// (baseline, avx2, avx512), and lives in namespace klserve::cpu::KLSERVE_ISA.
// The namespace keeps apart the inline functions that each variant compiles
// its own way: under one name, the linker would keep one copy for all, and
// an AVX-512 copy could run on a CPU without AVX-512.
#ifndef KLSERVE_ISA
#error "kernels/cpu/variant/ is compiled per ISA (kernels/CMakeLists.txt)"
#endif

#endif  // KLSERVE_KERNELS_CPU_VARIANT_ISA_NAMESPACE_H_
