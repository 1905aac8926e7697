#ifndef KLSERVE_CLIENT_SHARED_MEMORY_REGION_H_
#define KLSERVE_CLIENT_SHARED_MEMORY_REGION_H_

// SharedMemoryRegion: a POSIX shared-memory object this process creates and
// maps, for a klserve server on the same host to read inputs from and write
// outputs to (Client::RegisterRegion, RegionTensor in client/client.h).
//
// The object is /dev/shm/<key>, mode 0600: a server running as another user
// cannot open it (the region is a private channel between this process and
// its own server). It lives exactly as long as the SharedMemoryRegion: the
// destructor unmaps it and unlinks the name. A server that still has it
// mapped keeps its pages until it unmaps them; unregister first
// (Client::UnregisterRegion) so the server lets go at once.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace klserve {

class SharedMemoryRegion {
 public:
  // Creates a new object of `byte_size` (>= 1) zeroed bytes under a fresh
  // key ("klserve-<pid>-<counter>-<random hex>", never an existing one:
  // O_EXCL), and maps it read-write and shared. Its pages are allocated
  // here, so a /dev/shm too small for it (a container's default is 64 MiB)
  // fails now, as RESOURCE_EXHAUSTED, rather than with SIGBUS on a later
  // write. INVALID_ARGUMENT for a size < 1; other failures name the call
  // and its errno text.
  static absl::StatusOr<SharedMemoryRegion> Create(int64_t byte_size);

  SharedMemoryRegion(SharedMemoryRegion&& other) noexcept;
  SharedMemoryRegion& operator=(SharedMemoryRegion&& other) noexcept;
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;
  ~SharedMemoryRegion();

  // The name RegisterRegion takes: the object's shm_open name without '/'.
  const std::string& key() const { return key_; }
  std::byte* data() const { return data_; }
  int64_t byte_size() const { return byte_size_; }

 private:
  SharedMemoryRegion(std::string key, std::byte* data, int64_t byte_size)
      : key_(std::move(key)), data_(data), byte_size_(byte_size) {}

  // Unmaps and unlinks (a moved-from region holds nothing).
  void Release();

  std::string key_;
  std::byte* data_ = nullptr;
  int64_t byte_size_ = 0;
};

}  // namespace klserve

#endif  // KLSERVE_CLIENT_SHARED_MEMORY_REGION_H_
