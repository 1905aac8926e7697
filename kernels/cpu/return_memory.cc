#include "kernels/cpu/return_memory.h"

#include <malloc.h>

#include <cstddef>

// gperftools' C API (gperftools/malloc_extension_c.h, which Debian's
// libtcmalloc-minimal4 does not ship), weak: null unless the program links
// tcmalloc, as klserve may (top-level CMakeLists.txt).
extern "C" void MallocExtension_ReleaseToSystem(size_t num_bytes)
    __attribute__((weak));

namespace klserve::cpu {

void ReturnFreedMemory(int64_t bytes) {
  if (MallocExtension_ReleaseToSystem != nullptr) {
    // Releases at least `bytes` of the page heap's free spans.
    MallocExtension_ReleaseToSystem(static_cast<size_t>(bytes));
  } else {
    // glibc: returns the free pages of every arena.
    malloc_trim(0);
  }
}

}  // namespace klserve::cpu
