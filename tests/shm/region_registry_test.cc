// The region registry without a server: names, limits, leases and holds,
// on real shared-memory objects.

#include "server/shm/region_registry.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/shm/shm_object.h"

namespace klserve::server {
namespace {

using testing_shm::ShmObject;

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 absl::string_view field) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), field)) << status;
}

TEST(RegionRegistry, MapsTheObjectsBytesAtTheOffset) {
  ShmObject object(3 * 4096);
  std::memset(object.data() + 5000, 0x5a, 100);
  RegionRegistry registry(RegionLimits{});
  ASSERT_TRUE(registry.Register("r", object.key(), 5000, 100).ok());
  absl::StatusOr<RegionUse> use = registry.Use("x", "r");
  ASSERT_TRUE(use.ok()) << use.status();
  EXPECT_EQ(use->byte_size(), 100);
  EXPECT_EQ(use->data()[0], std::byte{0x5a});
  EXPECT_EQ(use->data()[99], std::byte{0x5a});
  // The server's writes reach the client's mapping.
  use->data()[1] = std::byte{7};
  EXPECT_EQ(object.data()[5001], std::byte{7});
}

TEST(RegionRegistry, NamesAndKeysArePlainNames) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{});
  for (const std::string& key :
       {std::string(""), std::string("."), std::string(".."),
        std::string("../etc/passwd"), std::string("a/b"), std::string("/x"),
        std::string(".hidden"), std::string("sp ace"),
        std::string("nul\0x", 5)}) {
    ExpectError(registry.Register("r", key, 0, 1).status(),
                absl::StatusCode::kInvalidArgument, "key:");
  }
  ExpectError(
      registry.Register(std::string(300, 'k'), object.key(), 0, 1).status(),
      absl::StatusCode::kInvalidArgument, "name:");
  ExpectError(registry.Register("a/b", object.key(), 0, 1).status(),
              absl::StatusCode::kInvalidArgument, "name:");
}

TEST(RegionRegistry, RefusesWhatIsNotAWholeRegularObject) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{});
  ExpectError(registry.Register("r", "klserve-test-none", 0, 1).status(),
              absl::StatusCode::kNotFound, "key:");
  ExpectError(registry.Register("r", object.key(), 4000, 97).status(),
              absl::StatusCode::kInvalidArgument, "byte_size:");
  // An offset at or past the end: no size would do.
  ExpectError(registry.Register("r", object.key(), 4096, 1).status(),
              absl::StatusCode::kInvalidArgument, "offset:");
  ExpectError(registry.Register("r", object.key(), 5000, 1).status(),
              absl::StatusCode::kInvalidArgument, "offset:");
  ExpectError(registry.Register("r", object.key(), INT64_MAX, 2).status(),
              absl::StatusCode::kInvalidArgument, "byte_size:");
  ExpectError(registry.Register("r", object.key(), -1, 2).status(),
              absl::StatusCode::kInvalidArgument, "offset:");
  ExpectError(registry.Register("r", object.key(), 0, 0).status(),
              absl::StatusCode::kInvalidArgument, "byte_size:");
  // A negative size is refused before it could count against the limit.
  ExpectError(
      registry.Register("r", object.key(), 0, -(int64_t{1} << 40)).status(),
      absl::StatusCode::kInvalidArgument, "byte_size:");
  ExpectError(registry.Register("r", object.key(), 0, INT64_MIN).status(),
              absl::StatusCode::kInvalidArgument, "byte_size:");
  // A symlink in /dev/shm to the object is never followed.
  const std::string link = "klserve-test-link-" + std::to_string(getpid());
  ASSERT_EQ(symlink(("/dev/shm/" + object.key()).c_str(),
                    ("/dev/shm/" + link).c_str()),
            0);
  const absl::Status linked = registry.Register("r", link, 0, 1).status();
  unlink(("/dev/shm/" + link).c_str());
  ExpectError(linked, absl::StatusCode::kInvalidArgument, "key:");
  EXPECT_TRUE(absl::StrContains(linked.message(), "symlink")) << linked;
  // Nor is a directory mapped.
  const std::string dir = "klserve-test-dir-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(("/dev/shm/" + dir).c_str(), 0700), 0);
  const absl::Status directory = registry.Register("r", dir, 0, 1).status();
  rmdir(("/dev/shm/" + dir).c_str());
  EXPECT_NE(directory.code(), absl::StatusCode::kOk);
  EXPECT_TRUE(registry.List().empty());
}

TEST(RegionRegistry, SameRegistrationRenewsOtherValuesConflict) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{});
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 64).ok());
  EXPECT_TRUE(registry.Register("r", object.key(), 0, 64).ok());
  ExpectError(registry.Register("r", object.key(), 0, 65).status(),
              absl::StatusCode::kAlreadyExists, "name:");
  ASSERT_EQ(registry.List().size(), 1u);
}

TEST(RegionRegistry, LimitsOnCountAndBytes) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{.max_regions = 2, .max_bytes = 100});
  ASSERT_TRUE(registry.Register("a", object.key(), 0, 40).ok());
  ExpectError(registry.Register("b", object.key(), 0, 61).status(),
              absl::StatusCode::kResourceExhausted, "byte_size:");
  ASSERT_TRUE(registry.Register("b", object.key(), 0, 60).ok());
  ExpectError(registry.Register("c", object.key(), 0, 1).status(),
              absl::StatusCode::kResourceExhausted, "name:");
  // Unregistering gives the room back.
  ASSERT_TRUE(registry.Unregister("a").ok());
  EXPECT_TRUE(registry.Register("c", object.key(), 0, 40).ok());
}

TEST(RegionRegistry, UnregisterIsRefusedWhileACallHoldsTheRegion) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{});
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 64).ok());
  {
    absl::StatusOr<RegionUse> use = registry.Use("x", "r");
    ASSERT_TRUE(use.ok());
    EXPECT_EQ(registry.List()[0].users, 1);
    ExpectError(registry.Unregister("r"), absl::StatusCode::kFailedPrecondition,
                "name:");
  }
  EXPECT_EQ(registry.List()[0].users, 0);
  EXPECT_TRUE(registry.Unregister("r").ok());
  ExpectError(registry.Unregister("r"), absl::StatusCode::kNotFound, "name:");
  ExpectError(registry.Use("tensor.region", "r").status(),
              absl::StatusCode::kNotFound, "tensor.region:");
}

TEST(RegionRegistry, LeaseEndsUnusedRegionsOnly) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{.lease = absl::Seconds(30)});
  ASSERT_TRUE(registry.Register("idle", object.key(), 0, 8).ok());
  ASSERT_TRUE(registry.Register("held", object.key(), 0, 8).ok());
  absl::StatusOr<RegionUse> use = registry.Use("x", "held");
  ASSERT_TRUE(use.ok());
  registry.DropExpired(absl::Now() + absl::Minutes(1));
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].name, "held");
}

TEST(RegionRegistry, ItsOwnThreadEndsLeases) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{.lease = absl::Milliseconds(200)});
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 8).ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!registry.List().empty() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(registry.List().empty());
}

// The object shrinking under the mapping: the access that would raise
// SIGBUS reads zeros instead, and the region reports itself damaged.
TEST(RegionRegistry, AnObjectShrinkingUnderTheMappingIsCaught) {
  ShmObject object(3 * 4096);
  RegionRegistry registry(RegionLimits{});
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 3 * 4096).ok());
  absl::StatusOr<RegionUse> use = registry.Use("x", "r");
  ASSERT_TRUE(use.ok());
  EXPECT_TRUE(use->CheckIntact().ok());
  object.Truncate(0);
  EXPECT_EQ(use->CheckIntact().code(), absl::StatusCode::kFailedPrecondition);
  volatile std::byte* bytes = use->data();
  const std::byte read = bytes[2 * 4096 + 10];  // would be SIGBUS
  EXPECT_EQ(read, std::byte{0});
  object.Truncate(3 * 4096);
  const absl::Status damaged = use->CheckIntact();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kFailedPrecondition) << damaged;
  // Re-registering the same values does not renew a damaged region.
  ExpectError(registry.Register("r", object.key(), 0, 3 * 4096).status(),
              absl::StatusCode::kFailedPrecondition, "name:");
}

// A job that restarts with a fixed key removes its object and makes a new
// one under the same key. Its calls on the old registration are refused
// (what it writes now is not what is mapped), and registering the same
// values again maps the new object, where a renewal used to keep the old.
TEST(RegionRegistry, AnObjectReplacedUnderItsKeyIsMappedAnew) {
  auto old_object = std::make_unique<ShmObject>(4096);
  const std::string key = old_object->key();
  old_object->data()[0] = std::byte{1};
  RegionRegistry registry(RegionLimits{.max_bytes = 4096});
  ASSERT_TRUE(registry.Register("r", key, 0, 4096).ok());
  old_object->Unlink();
  {
    absl::StatusOr<RegionUse> use = registry.Use("x", "r");
    ASSERT_TRUE(use.ok());
    const absl::Status removed = use->CheckIntact();
    EXPECT_EQ(removed.code(), absl::StatusCode::kFailedPrecondition) << removed;
    EXPECT_TRUE(absl::StrContains(removed.message(), "removed or replaced"))
        << removed;
  }
  ShmObject new_object(4096, key);
  new_object.data()[0] = std::byte{2};
  {
    // Not while a call holds the old mapping.
    absl::StatusOr<RegionUse> use = registry.Use("x", "r");
    ASSERT_TRUE(use.ok());
    ExpectError(registry.Register("r", key, 0, 4096).status(),
                absl::StatusCode::kFailedPrecondition, "name:");
  }
  // Within --max_region_bytes: the old mapping's bytes are given back.
  ASSERT_TRUE(registry.Register("r", key, 0, 4096).ok());
  absl::StatusOr<RegionUse> use = registry.Use("x", "r");
  ASSERT_TRUE(use.ok());
  EXPECT_TRUE(use->CheckIntact().ok()) << use->CheckIntact();
  EXPECT_EQ(use->data()[0], std::byte{2});
  use->data()[1] = std::byte{3};
  EXPECT_EQ(new_object.data()[1], std::byte{3});
  ASSERT_EQ(registry.List().size(), 1u);
  // With the object unchanged, registering again is a renewal.
  EXPECT_TRUE(registry.Register("r", key, 0, 4096).ok());
}

// An object renamed away keeps its links, but the key no longer names it:
// the rule is the object under the key, not the object's link count.
TEST(RegionRegistry, AnObjectRenamedAwayNoLongerServesItsKey) {
  ShmObject object(4096);
  RegionRegistry registry(RegionLimits{});
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 4096).ok());
  const std::string from = "/dev/shm/" + object.key();
  const std::string to = from + "-moved";
  ASSERT_EQ(rename(from.c_str(), to.c_str()), 0);
  {
    absl::StatusOr<RegionUse> use = registry.Use("x", "r");
    ASSERT_TRUE(use.ok());
    EXPECT_EQ(use->CheckIntact().code(), absl::StatusCode::kFailedPrecondition);
  }
  // Nothing under the key now: registering again drops the stale
  // registration and fails as a new one would.
  ExpectError(registry.Register("r", object.key(), 0, 4096).status(),
              absl::StatusCode::kNotFound, "key:");
  EXPECT_TRUE(registry.List().empty());
  ASSERT_EQ(rename(to.c_str(), from.c_str()), 0);  // for ShmObject to remove
}

// An object shrunk in place (same key, same object) leaves a registration
// no call can use: registering the same values again does not renew it but
// registers anew, which fails while the object is too small and succeeds
// once it has grown back (found by an attacking helper: it renewed).
TEST(RegionRegistry, ARegionShrunkInPlaceIsRegisteredAnewNotRenewed) {
  ShmObject object(2 * 4096);
  RegionRegistry registry(RegionLimits{.max_bytes = 2 * 4096});
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 2 * 4096).ok());
  object.Truncate(4096);
  ExpectError(registry.Register("r", object.key(), 0, 2 * 4096).status(),
              absl::StatusCode::kInvalidArgument, "byte_size:");
  EXPECT_TRUE(registry.List().empty());
  object.Truncate(2 * 4096);
  ASSERT_TRUE(registry.Register("r", object.key(), 0, 2 * 4096).ok());
  absl::StatusOr<RegionUse> use = registry.Use("x", "r");
  ASSERT_TRUE(use.ok());
  EXPECT_TRUE(use->CheckIntact().ok()) << use->CheckIntact();
}

// A SIGBUS that no access raised (kill) is not taken for a fault in a
// guarded region: the process's own handler, or the default, gets it.
TEST(FaultGuardDeathTest, ASentSigbusStillEndsTheProcess) {
  // The registry in the child: its thread must not exist at the fork.
  // Killed by a signal: SIGBUS itself, or SIGABRT from a sanitizer's
  // handler that the guard passes it on to.
  // The object in the parent, which removes it: the child dies unwound.
  ShmObject object(4096);
  EXPECT_EXIT(
      {
        RegionRegistry registry(RegionLimits{});
        if (registry.Register("r", object.key(), 0, 4096).ok()) {
          raise(SIGBUS);
        }
        _exit(0);
      },
      [](int status) { return WIFSIGNALED(status); }, "");
}

}  // namespace
}  // namespace klserve::server
