// SharedMemoryRegion: a fresh object under /dev/shm, another mapping of it
// (opened by key, as the server opens it) sees what this one wrote, keys
// differ, a move hands the object over, and destruction unlinks it.

#include "client/shared_memory_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace klserve {
namespace {

bool ShmFileExists(const std::string& key) {
  struct stat st;
  return stat(("/dev/shm/" + key).c_str(), &st) == 0;
}

// Objects in /dev/shm named by this process's regions.
int RegionsOfThisProcess() {
  const std::string prefix = absl::StrCat("klserve-", getpid(), "-");
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (absl::StartsWith(entry.path().filename().string(), prefix)) ++count;
  }
  return count;
}

TEST(SharedMemoryRegionTest, AnotherMappingByKeySeesTheBytes) {
  constexpr int64_t kBytes = 3 * 4096 + 17;  // not a page multiple
  absl::StatusOr<SharedMemoryRegion> region =
      SharedMemoryRegion::Create(kBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_NE(region->data(), nullptr);
  EXPECT_EQ(region->byte_size(), kBytes);
  EXPECT_TRUE(absl::StartsWith(region->key(), "klserve-")) << region->key();

  struct stat st;
  ASSERT_EQ(stat(("/dev/shm/" + region->key()).c_str(), &st), 0);
  EXPECT_EQ(st.st_size, kBytes);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(S_ISREG(st.st_mode));

  // Fresh bytes are zero.
  for (int64_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(region->data()[i], std::byte{0}) << i;
  }
  for (int64_t i = 0; i < kBytes; ++i) {
    region->data()[i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
  }

  const int fd = shm_open(("/" + region->key()).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  void* other =
      mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(other, MAP_FAILED) << std::strerror(errno);
  auto* bytes = static_cast<unsigned char*>(other);
  for (int64_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(bytes[i], (i * 7 + 3) & 0xff) << i;
  }
  // And the other way: what the second mapping writes, the region reads.
  bytes[kBytes - 1] = 0xa5;
  EXPECT_EQ(region->data()[kBytes - 1], std::byte{0xa5});
  munmap(other, kBytes);
}

TEST(SharedMemoryRegionTest, DestructionUnlinksTheObject) {
  std::string key;
  {
    absl::StatusOr<SharedMemoryRegion> region = SharedMemoryRegion::Create(64);
    ASSERT_TRUE(region.ok()) << region.status();
    key = region->key();
    EXPECT_TRUE(ShmFileExists(key));
  }
  EXPECT_FALSE(ShmFileExists(key)) << key;
  EXPECT_LT(shm_open(("/" + key).c_str(), O_RDWR, 0), 0);
}

TEST(SharedMemoryRegionTest, KeysAreUnique) {
  absl::StatusOr<SharedMemoryRegion> a = SharedMemoryRegion::Create(8);
  absl::StatusOr<SharedMemoryRegion> b = SharedMemoryRegion::Create(8);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->key(), b->key());
  EXPECT_NE(a->data(), b->data());
  // Within the rules RegisterRegion has for keys: 1 to 255 of
  // [A-Za-z0-9._-], not starting with '.'.
  for (const std::string& key : {a->key(), b->key()}) {
    EXPECT_LE(key.size(), 255u);
    EXPECT_NE(key[0], '.');
    for (char c : key) {
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                  c == '_' || c == '-')
          << key;
    }
  }
}

TEST(SharedMemoryRegionTest, MoveHandsTheObjectOver) {
  absl::StatusOr<SharedMemoryRegion> created = SharedMemoryRegion::Create(32);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string key = created->key();
  std::byte* const data = created->data();
  data[0] = std::byte{42};

  SharedMemoryRegion moved = *std::move(created);
  EXPECT_EQ(moved.key(), key);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.byte_size(), 32);
  EXPECT_EQ(created->data(), nullptr);  // NOLINT: checking the moved-from
  EXPECT_EQ(created->byte_size(), 0);   // NOLINT
  created = absl::StatusOr<SharedMemoryRegion>();  // destroys the moved-from
  EXPECT_TRUE(ShmFileExists(key));
  EXPECT_EQ(moved.data()[0], std::byte{42});

  // Assigning over a live region releases that one's object.
  absl::StatusOr<SharedMemoryRegion> other = SharedMemoryRegion::Create(16);
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string other_key = other->key();
  moved = *std::move(other);
  EXPECT_FALSE(ShmFileExists(key));
  EXPECT_TRUE(ShmFileExists(other_key));
  EXPECT_EQ(moved.key(), other_key);
}

TEST(SharedMemoryRegionTest, RefusesANonPositiveSize) {
  for (int64_t size : {int64_t{0}, int64_t{-1}}) {
    absl::StatusOr<SharedMemoryRegion> region =
        SharedMemoryRegion::Create(size);
    ASSERT_FALSE(region.ok());
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(region.status().message(), "byte_size"))
        << region.status();
  }
}

TEST(SharedMemoryRegionTest, MoreThanDevShmHoldsIsAnErrorNotACrash) {
  // 1 PiB: more than any /dev/shm holds (tmpfs refuses a fallocate past its
  // size up front, before allocating anything), so Create fails, naming
  // the object, and leaves no name behind.
  absl::StatusOr<SharedMemoryRegion> region =
      SharedMemoryRegion::Create(int64_t{1} << 50);
  ASSERT_FALSE(region.ok());
  EXPECT_TRUE(absl::StrContains(region.status().message(), "/dev/shm/klserve-"))
      << region.status();
  EXPECT_EQ(RegionsOfThisProcess(), 0);
}

}  // namespace
}  // namespace klserve
