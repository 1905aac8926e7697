#ifndef KLSERVE_KERNELS_CPU_RETURN_MEMORY_H_
#define KLSERVE_KERNELS_CPU_RETURN_MEMORY_H_

#include <cstdint>

namespace klserve::cpu {

// Asks the allocator to give about `bytes` of its free memory back to the OS,
// after that much was freed. Allocators keep freed memory for reuse (the
// server links tcmalloc, whose page heap would hold a wide request's scratch
// for good), so freeing alone leaves the process's RSS where it was.
void ReturnFreedMemory(int64_t bytes);

}  // namespace klserve::cpu

#endif  // KLSERVE_KERNELS_CPU_RETURN_MEMORY_H_
