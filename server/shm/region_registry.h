#ifndef KLSERVE_SERVER_SHM_REGION_REGISTRY_H_
#define KLSERVE_SERVER_SHM_REGION_REGISTRY_H_

// The shared-memory regions registered with the server, by name, within the
// server's limits, each under a lease.
//
// Lifetime: a region a call uses is held by that call (RegionUse) and stays
// mapped until the last call holding it ends, whatever happens to its name
// meanwhile. Unregistering a region that calls hold is refused, so a
// client learns that its calls are still reading or writing the bytes it
// means to reuse. A region no call has named, and nobody re-registered,
// for the lease is unregistered by the registry's own thread: the bound on
// how long a client that went away leaves memory mapped.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/shm/mapped_region.h"

namespace klserve::server {

struct RegionLimits {
  int max_regions = 64;                      // registered at once
  int64_t max_bytes = int64_t{16} << 30;     // their byte_size summed
  absl::Duration lease = absl::Minutes(10);  // unused this long: dropped
};

struct RegionStatusInfo {
  std::string name;
  std::string key;
  int64_t offset = 0;
  int64_t byte_size = 0;
  int users = 0;
  absl::Duration lease_left;
};

class RegionRegistry;

// A registered region held by one call; movable. Released on destruction.
class RegionUse {
 public:
  RegionUse(RegionUse&& other) noexcept;
  RegionUse& operator=(RegionUse&&) = delete;
  RegionUse(const RegionUse&) = delete;
  ~RegionUse();

  std::byte* data() const;
  int64_t byte_size() const;
  const std::string& name() const;
  // As MappedRegion::CheckIntact.
  absl::Status CheckIntact() const;

 private:
  friend class RegionRegistry;
  struct Entry;
  RegionUse(RegionRegistry* registry, std::shared_ptr<Entry> entry)
      : registry_(registry), entry_(std::move(entry)) {}

  RegionRegistry* registry_;
  std::shared_ptr<Entry> entry_;
};

class RegionRegistry {
 public:
  // Told the regions' count and bytes after every change (for metrics).
  using Observer = std::function<void(int regions, int64_t bytes)>;

  // Starts the thread that ends expired leases.
  explicit RegionRegistry(const RegionLimits& limits,
                          Observer observer = nullptr);
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Maps and registers; returns the lease. The same name with the same key,
  // offset and byte_size renews the lease, unless no call could use the
  // registration (its object shrank, or the key no longer names it): then
  // it is dropped and the key's object now registered anew
  // (FAILED_PRECONDITION while calls use the old). With other values it is
  // ALREADY_EXISTS. RESOURCE_EXHAUSTED past the limits.
  absl::StatusOr<absl::Duration> Register(absl::string_view name,
                                          absl::string_view key, int64_t offset,
                                          int64_t byte_size);
  // NOT_FOUND for an unknown name, FAILED_PRECONDITION while calls use it.
  absl::Status Unregister(absl::string_view name);
  std::vector<RegionStatusInfo> List() const;
  const RegionLimits& limits() const { return limits_; }

  // The region `name` for one call, renewing its lease. NOT_FOUND naming
  // `field` for an unknown name.
  absl::StatusOr<RegionUse> Use(absl::string_view field,
                                absl::string_view name);

  // Drops every region whose lease ended by `now` and no call holds. The
  // registry's thread calls it; tests too.
  void DropExpired(absl::Time now);

 private:
  friend class RegionUse;
  using Entry = RegionUse::Entry;
  void Release(Entry& entry);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED once --max_regions regions are registered.
  absl::Status CheckRoomForOneMore() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegionLimits limits_;
  const Observer observer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<RegionUse::Entry>> regions_
      ABSL_GUARDED_BY(mu_);
  int64_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace klserve::server

#endif  // KLSERVE_SERVER_SHM_REGION_REGISTRY_H_
