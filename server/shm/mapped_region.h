#ifndef KLSERVE_SERVER_SHM_MAPPED_REGION_H_
#define KLSERVE_SERVER_SHM_MAPPED_REGION_H_

// One registered region's bytes, mapped read-write into the server: a slice
// of a POSIX shared-memory object that a client on this host created.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace klserve::server {

class MappedRegion {
 public:
  // Maps [offset, offset + byte_size) of the object /dev/shm/<key> (key a
  // plain name, region_names.h). The object must be a regular file, not a
  // symlink, of at least offset + byte_size bytes, that the server may
  // read and write. NOT_FOUND when there is none, PERMISSION_DENIED when
  // the server may not open it, INVALID_ARGUMENT for the rest; each names
  // `field`.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> Map(
      absl::string_view field, absl::string_view key, int64_t offset,
      int64_t byte_size);

  // INVALID_ARGUMENT unless offset >= 0, byte_size >= 1 and their sum fits
  // int64 (what Map checks first).
  static absl::Status CheckBounds(int64_t offset, int64_t byte_size);

  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  std::byte* data() const { return data_; }
  int64_t byte_size() const { return byte_size_; }

  // FAILED_PRECONDITION naming the region when its object no longer holds
  // all of it: it shrank, now or while a call read it (fault_guard.h); a
  // damaged region stays damaged. Or when /dev/shm/<key> is no longer this
  // object (IsObjectAt): what the client writes under the key now (a job
  // that restarted, say) is not what the server would read.
  absl::Status CheckIntact(absl::string_view name, absl::string_view key) const;
  // Whether /dev/shm/<key> is still the object this maps (not removed,
  // renamed, nor replaced by a new one under the same key).
  bool IsObjectAt(absl::string_view key) const;
  // Whether a call found the object shrunk under it (fault_guard.h).
  bool damaged() const { return damaged_.load(std::memory_order_relaxed); }

 private:
  MappedRegion(int fd, dev_t device, ino_t inode, void* mapping,
               size_t mapping_size, std::byte* data, int64_t end,
               int64_t byte_size)
      : fd_(fd),
        device_(device),
        inode_(inode),
        mapping_(mapping),
        mapping_size_(mapping_size),
        data_(data),
        end_(end),
        byte_size_(byte_size) {}

  int fd_;  // kept open to see the object's size when a call starts
  // The object's identity, to tell it from another under the same key.
  dev_t device_;
  ino_t inode_;
  void* mapping_;  // from the page below the offset
  size_t mapping_size_;
  std::byte* data_;
  int64_t end_;  // offset + byte_size
  int64_t byte_size_;
  int guard_slot_ = -1;
  std::atomic<bool> damaged_{false};
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SHM_MAPPED_REGION_H_
