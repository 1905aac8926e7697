# The ISA variants of the CPU kernels (kernels/cpu/isa.h), and a function that
# compiles sources once per variant. Each variant is compiled with its own
# -march/-m flags after the project's, so it is the same whatever
# KLSERVE_NATIVE says, with KLSERVE_ISA naming its namespace
# (kernels/cpu/variant/isa_namespace.h).

set(KLSERVE_ISA_VARIANTS baseline avx2 avx512)
set(KLSERVE_ISA_ENUM_baseline kBaseline)
set(KLSERVE_ISA_ENUM_avx2 kAvx2)
set(KLSERVE_ISA_ENUM_avx512 kAvx512)
# What kernels/cpu/isa.cc's CpuRuns checks for each.
set(KLSERVE_ISA_FLAGS_baseline -march=x86-64-v2)
set(KLSERVE_ISA_FLAGS_avx2 -march=x86-64-v2 -mavx2 -mfma -mf16c)
set(KLSERVE_ISA_FLAGS_avx512 ${KLSERVE_ISA_FLAGS_avx2}
    -mavx512f -mavx512dq -mavx512bw -mavx512vl)

# klserve_isa_variants(NAME SOURCES src... [LINK target...]) makes one OBJECT
# library NAME_<variant> per variant (LINK gives their include paths and
# definitions) and sets NAME_OBJECTS to their objects, the baseline's first:
# where two variants emit the same inline function outside their namespaces
# (a library template, say), the linker keeps the first copy it meets, and
# the baseline's runs everywhere.
function(klserve_isa_variants name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINK" ${ARGN})
  set(objects "")
  foreach(isa IN LISTS KLSERVE_ISA_VARIANTS)
    set(target ${name}_${isa})
    add_library(${target} OBJECT ${ARG_SOURCES})
    target_compile_definitions(${target} PRIVATE
      KLSERVE_ISA=${isa} KLSERVE_ISA_ENUM=${KLSERVE_ISA_ENUM_${isa}})
    # -Wno-psabi: GCC and clang note that 32- and 64-byte vector arguments
    # pass differently without AVX and AVX-512; they never cross a
    # variant's boundary.
    target_compile_options(${target} PRIVATE ${KLSERVE_ISA_FLAGS_${isa}}
      $<$<CXX_COMPILER_ID:GNU,Clang>:-Wno-psabi>)
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
    if(ARG_LINK)
      target_link_libraries(${target} PRIVATE ${ARG_LINK})
    endif()
    list(APPEND objects $<TARGET_OBJECTS:${target}>)
  endforeach()
  set(${name}_OBJECTS ${objects} PARENT_SCOPE)
endfunction()
