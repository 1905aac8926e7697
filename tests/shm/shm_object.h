#ifndef KLSERVE_TESTS_SHM_SHM_OBJECT_H_
#define KLSERVE_TESTS_SHM_SHM_OBJECT_H_

// A POSIX shared-memory object made by a test, as a client makes one:
// /dev/shm/<key>, mapped read-write, removed on destruction.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace klserve::testing_shm {

class ShmObject {
 public:
  explicit ShmObject(int64_t byte_size)
      : ShmObject(byte_size,
                  absl::StrCat("klserve-test-", getpid(), "-", NextSerial())) {}
  // Under a key of the test's choosing, which must be free.
  ShmObject(int64_t byte_size, std::string key)
      : byte_size_(byte_size), key_(std::move(key)) {
    const std::string name = "/" + key_;
    fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    EXPECT_GE(fd_, 0) << name;
    EXPECT_EQ(ftruncate(fd_, byte_size), 0);
    void* p =
        mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<std::byte*>(p);
  }
  ~ShmObject() {
    munmap(data_, byte_size_);
    close(fd_);
    if (linked_) shm_unlink(("/" + key_).c_str());
  }
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  const std::string& key() const { return key_; }
  std::byte* data() const { return data_; }
  int64_t byte_size() const { return byte_size_; }
  // Shrinks (or grows) the object under whoever has it mapped.
  void Truncate(int64_t bytes) { ASSERT_EQ(ftruncate(fd_, bytes), 0); }
  // Removes its name from /dev/shm, as a client does at exit; whoever has
  // it mapped keeps the bytes, and the key is free for a new object.
  void Unlink() {
    ASSERT_EQ(shm_unlink(("/" + key_).c_str()), 0);
    linked_ = false;
  }

 private:
  static int NextSerial() {
    static std::atomic<int> serial{0};
    return serial++;
  }

  int64_t byte_size_;
  std::string key_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
  bool linked_ = true;
};

}  // namespace klserve::testing_shm

#endif  // KLSERVE_TESTS_SHM_SHM_OBJECT_H_
