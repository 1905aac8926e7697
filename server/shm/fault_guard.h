#ifndef KLSERVE_SERVER_SHM_FAULT_GUARD_H_
#define KLSERVE_SERVER_SHM_FAULT_GUARD_H_

// Survives a client shrinking a shared-memory object the server has mapped.
// Touching a mapped page past the object's new end raises SIGBUS, which
// would kill the server for every caller. The process's SIGBUS handler
// looks the faulting address up among the guarded mappings; inside one, it
// maps zero pages over the whole mapping (so the access, retried, succeeds
// and reads zeros) and marks the mapping damaged, which the call using it
// sees when it finishes and turns into an error. A fault anywhere else
// goes on to the handler that was there before (or the default: a crash,
// as without the guard).

#include <atomic>
#include <cstddef>

#include "absl/status/statusor.h"

namespace klserve::server {

// At most this many mappings are guarded at once (bounds --max_regions).
inline constexpr int kMaxGuardedMappings = 4096;

// Guards [base, base + size), a mapping of the caller's, until Unguard.
// `damaged` is set from the signal handler, and must outlive the guard.
// Installs the handler on first use. RESOURCE_EXHAUSTED when
// kMaxGuardedMappings are guarded.
absl::StatusOr<int> Guard(void* base, size_t size, std::atomic<bool>* damaged);

// Ends the guard `slot` (from Guard). The mapping must not be in use.
void Unguard(int slot);

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SHM_FAULT_GUARD_H_
