#include "client/shared_memory_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace klserve {
namespace {

std::string ErrnoText(int error) {
  return absl::StrCat(std::strerror(error), " (errno ", error, ")");
}

// A key no other live object has: the pid tells processes apart, the
// counter this process's regions, and the random part a reused pid (a
// process that died without unlinking leaves its name behind).
std::string NewKey() {
  static std::atomic<uint64_t> counter{0};
  absl::BitGen random;
  return absl::StrFormat("klserve-%d-%d-%016x", getpid(),
                         counter.fetch_add(1, std::memory_order_relaxed),
                         absl::Uniform<uint64_t>(random));
}

}  // namespace

absl::StatusOr<SharedMemoryRegion> SharedMemoryRegion::Create(
    int64_t byte_size) {
  if (byte_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SharedMemoryRegion: byte_size must be >= 1, got ", byte_size));
  }
  std::string key;
  int fd = -1;
  // EEXIST only if a stale object happens to carry the same name (see
  // NewKey); a few fresh keys get past it.
  for (int tries = 0; tries < 4 && fd < 0; ++tries) {
    key = NewKey();
    fd = shm_open(("/" + key).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC,
                  0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int error = errno;
    return absl::Status(error == EACCES ? absl::StatusCode::kPermissionDenied
                                        : absl::StatusCode::kInternal,
                        absl::StrCat("SharedMemoryRegion: shm_open(\"/", key,
                                     "\"): ", ErrnoText(error)));
  }
  // From here on a failure must not leave the name behind.
  const auto fail = [&](absl::StatusCode code, absl::string_view call,
                        int error) {
    close(fd);
    shm_unlink(("/" + key).c_str());
    return absl::Status(code, absl::StrCat("SharedMemoryRegion: ", call, " of ",
                                           byte_size, " bytes for /dev/shm/",
                                           key, ": ", ErrnoText(error)));
  };
  if (ftruncate(fd, byte_size) != 0) {
    return fail(absl::StatusCode::kInternal, "ftruncate", errno);
  }
  // tmpfs hands out pages on first touch, and a write past what /dev/shm
  // holds is SIGBUS; allocating them now turns that into an error here.
  if (const int error = posix_fallocate(fd, 0, byte_size); error != 0) {
    return fail(error == ENOSPC ? absl::StatusCode::kResourceExhausted
                                : absl::StatusCode::kInternal,
                "posix_fallocate", error);
  }
  void* data =
      mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return fail(errno == ENOMEM ? absl::StatusCode::kResourceExhausted
                                : absl::StatusCode::kInternal,
                "mmap", errno);
  }
  // The mapping keeps the object; the descriptor is no longer needed.
  close(fd);
  return SharedMemoryRegion(std::move(key), static_cast<std::byte*>(data),
                            byte_size);
}

SharedMemoryRegion::SharedMemoryRegion(SharedMemoryRegion&& other) noexcept
    : key_(std::move(other.key_)),
      data_(std::exchange(other.data_, nullptr)),
      byte_size_(std::exchange(other.byte_size_, 0)) {
  other.key_.clear();
}

SharedMemoryRegion& SharedMemoryRegion::operator=(
    SharedMemoryRegion&& other) noexcept {
  if (this != &other) {
    Release();
    key_ = std::move(other.key_);
    other.key_.clear();
    data_ = std::exchange(other.data_, nullptr);
    byte_size_ = std::exchange(other.byte_size_, 0);
  }
  return *this;
}

SharedMemoryRegion::~SharedMemoryRegion() { Release(); }

void SharedMemoryRegion::Release() {
  if (data_ == nullptr) return;
  munmap(data_, byte_size_);
  shm_unlink(("/" + key_).c_str());
  data_ = nullptr;
  byte_size_ = 0;
  key_.clear();
}

}  // namespace klserve
