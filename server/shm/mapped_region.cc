#include "server/shm/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "server/shm/fault_guard.h"

namespace klserve::server {
namespace {

absl::Status OpenError(absl::string_view field, absl::string_view key,
                       int error) {
  const std::string what = absl::StrCat(field, ": /dev/shm/", key, ": ");
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(
          absl::StrCat(what, "no such shared-memory object"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat(what, "the server may not open it read-write (",
                       strerror(error), ")"));
    case ELOOP:
      return absl::InvalidArgumentError(
          absl::StrCat(what, "a symlink, which is never followed"));
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(
          absl::StrCat(what, "the server has no file descriptor left (",
                       strerror(error), "); each region holds one"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, "cannot open it (", strerror(error), ")"));
  }
}

}  // namespace

absl::Status MappedRegion::CheckBounds(int64_t offset, int64_t byte_size) {
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset: must be >= 0, got ", offset));
  }
  if (byte_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte_size: must be >= 1, got ", byte_size));
  }
  int64_t end = 0;
  if (__builtin_add_overflow(offset, byte_size, &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte_size: offset + byte_size overflows, got ", offset,
                     " + ", byte_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::Map(
    absl::string_view field, absl::string_view key, int64_t offset,
    int64_t byte_size) {
  RETURN_IF_ERROR(CheckBounds(offset, byte_size));
  const int64_t end = offset + byte_size;
  // glibc's shm_open adds O_NOFOLLOW too; opening the file directly says
  // so here, and O_NONBLOCK keeps a FIFO planted under the name from
  // blocking the open.
  const std::string path = absl::StrCat("/dev/shm/", key);
  const int fd =
      open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return OpenError(field, key, errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": /dev/shm/", key, ": not a regular file"));
  }
  if (st.st_size <= offset) {  // no byte of the region would be in the file
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("offset: ", offset, " is at or past the end of /dev/shm/",
                     key, " (", st.st_size, " bytes)"));
  }
  if (st.st_size < end) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size: offset + byte_size is ", end, " bytes, past the end of ",
        "/dev/shm/", key, " (", st.st_size, " bytes)"));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = offset - offset % page;
  const auto map_size = static_cast<size_t>(end - map_offset);
  void* mapping = mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                       fd, map_offset);
  if (mapping == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": /dev/shm/", key, ": cannot map ", map_size,
                     " bytes (", strerror(error), ")"));
  }
  std::unique_ptr<MappedRegion> region(
      new MappedRegion(fd, st.st_dev, st.st_ino, mapping, map_size,
                       static_cast<std::byte*>(mapping) + (offset - map_offset),
                       end, byte_size));
  absl::StatusOr<int> slot = Guard(mapping, map_size, &region->damaged_);
  if (!slot.ok()) return slot.status();  // the destructor unmaps
  region->guard_slot_ = *slot;
  return region;
}

MappedRegion::~MappedRegion() {
  if (guard_slot_ >= 0) Unguard(guard_slot_);
  munmap(mapping_, mapping_size_);
  close(fd_);
}

absl::Status MappedRegion::CheckIntact(absl::string_view name,
                                       absl::string_view key) const {
  struct stat st;
  if (damaged_.load(std::memory_order_relaxed) || fstat(fd_, &st) != 0 ||
      st.st_size < end_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region '", name, "': its shared-memory object shrank below the ",
        "region (", end_, " bytes); the call's outputs are void; unregister ",
        "it and register a new one"));
  }
  if (!IsObjectAt(key)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region '", name, "': /dev/shm/", key, " is no longer the object ",
        "registered (it was removed or replaced); the call's outputs are ",
        "void; register the region again to map the object there now"));
  }
  return absl::OkStatus();
}

bool MappedRegion::IsObjectAt(absl::string_view key) const {
  struct stat st;
  const std::string path = absl::StrCat("/dev/shm/", key);
  // lstat: a symlink planted under the key is not the object either.
  return lstat(path.c_str(), &st) == 0 && st.st_dev == device_ &&
         st.st_ino == inode_;
}

}  // namespace klserve::server
