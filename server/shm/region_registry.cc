#include "server/shm/region_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "server/shm/region_names.h"

namespace klserve::server {

struct RegionUse::Entry {
  std::string name;
  std::string key;
  int64_t offset = 0;
  std::unique_ptr<MappedRegion> mapping;
  // Guarded by the registry's mutex.
  int users = 0;
  absl::Time last_used;
};

RegionUse::RegionUse(RegionUse&& other) noexcept
    : registry_(other.registry_), entry_(std::move(other.entry_)) {}

RegionUse::~RegionUse() {
  if (entry_ != nullptr) registry_->Release(*entry_);
}

std::byte* RegionUse::data() const { return entry_->mapping->data(); }
int64_t RegionUse::byte_size() const { return entry_->mapping->byte_size(); }
const std::string& RegionUse::name() const { return entry_->name; }
absl::Status RegionUse::CheckIntact() const {
  return entry_->mapping->CheckIntact(entry_->name, entry_->key);
}

RegionRegistry::RegionRegistry(const RegionLimits& limits, Observer observer)
    : limits_(limits), observer_(std::move(observer)) {
  // Checks a few times per lease, at most once a second: a lease ends at
  // most a quarter late.
  const absl::Duration period =
      std::clamp(limits_.lease / 4, absl::Milliseconds(50), absl::Seconds(1));
  reaper_ = std::thread([this, period] {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) {
      mu_.Unlock();
      DropExpired(absl::Now());
      mu_.Lock();
    }
  });
}

RegionRegistry::~RegionRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reaper_.join();
}

absl::StatusOr<absl::Duration> RegionRegistry::Register(absl::string_view name,
                                                        absl::string_view key,
                                                        int64_t offset,
                                                        int64_t byte_size) {
  RETURN_IF_ERROR(CheckPlainName("name", name, kMaxRegionNameBytes));
  RETURN_IF_ERROR(CheckPlainName("key", key, kMaxRegionKeyBytes));
  // Before any bytes are reserved for it below.
  RETURN_IF_ERROR(MappedRegion::CheckBounds(offset, byte_size));
  // A registration this call replaces, unmapped after the locks (see
  // Unregister).
  std::shared_ptr<Entry> replaced;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = regions_.find(name); it != regions_.end()) {
      Entry& held = *it->second;
      if (held.key != key || held.offset != offset ||
          held.mapping->byte_size() != byte_size) {
        return absl::AlreadyExistsError(
            absl::StrCat("name: region '", name, "' is registered with key '",
                         held.key, "', offset ", held.offset, ", byte_size ",
                         held.mapping->byte_size(), "; unregister it first"));
      }
      const absl::Status intact = held.mapping->CheckIntact(name, key);
      if (intact.ok()) {
        held.last_used = absl::Now();
        return limits_.lease;
      }
      // The object shrank under the region, or the key no longer names it
      // (a job that restarted with a fixed key): renewing would keep a
      // registration no call can use, or serve the old bytes. So the
      // registration is made anew from the object under the key now.
      if (held.users > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "name: region '", name, "' can no longer be used as registered ",
            "(its object shrank, or /dev/shm/", key, " is no longer it), ",
            "and ", held.users, " call(s) use it; register it again once ",
            "they finish"));
      }
      mapped_bytes_ -= held.mapping->byte_size();
      replaced = std::move(it->second);
      regions_.erase(it);
      Changed();
    }
    RETURN_IF_ERROR(CheckRoomForOneMore());
    if (byte_size > limits_.max_bytes - mapped_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "byte_size: ", byte_size, " more bytes would pass the ",
          limits_.max_bytes, " bytes all regions may map (--max_region_bytes; ",
          mapped_bytes_, " mapped)"));
    }
    // Counted before mapping, so that two registrations racing cannot both
    // pass the limit; given back if the mapping fails.
    mapped_bytes_ += byte_size;
  }
  // Unmapped before the new mapping is made, so that the two never pass
  // --max_region_bytes together.
  replaced.reset();
  // Declared before the lock, so that a mapping this call does not keep is
  // unmapped after the lock is released (see Unregister).
  absl::StatusOr<std::unique_ptr<MappedRegion>> mapping =
      MappedRegion::Map("key", key, offset, byte_size);
  absl::MutexLock lock(&mu_);
  if (!mapping.ok()) {
    mapped_bytes_ -= byte_size;
    return mapping.status();
  }
  // Another registration may have taken the name, or the last place,
  // while this one mapped.
  if (const auto it = regions_.find(name); it != regions_.end()) {
    mapped_bytes_ -= byte_size;
    const Entry& held = *it->second;
    if (held.key != key || held.offset != offset ||
        held.mapping->byte_size() != byte_size) {
      return absl::AlreadyExistsError(
          absl::StrCat("name: region '", name, "' was registered with other ",
                       "values by another call at the same time"));
    }
    if (!held.mapping->IsObjectAt(key)) {
      // The other call mapped the object that this one's replaced.
      return absl::AbortedError(absl::StrCat(
          "name: region '", name, "' was registered by another call at the ",
          "same time, while /dev/shm/", key, " was replaced; register it ",
          "again"));
    }
    return limits_.lease;  // the same registration: a renewal
  }
  if (absl::Status room = CheckRoomForOneMore(); !room.ok()) {
    mapped_bytes_ -= byte_size;
    return room;
  }
  auto entry = std::make_shared<Entry>();
  entry->name = std::string(name);
  entry->key = std::string(key);
  entry->offset = offset;
  entry->mapping = *std::move(mapping);
  entry->last_used = absl::Now();
  regions_.emplace(name, std::move(entry));
  Changed();
  return limits_.lease;
}

absl::Status RegionRegistry::Unregister(absl::string_view name) {
  // The entry leaves the table under the lock and is destroyed after it:
  // unmapping a large region takes long, and every call that names a
  // region waits on this lock.
  std::shared_ptr<Entry> dropped;
  absl::MutexLock lock(&mu_);
  const auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("name: no region named '", name, "' is registered"));
  }
  if (it->second->users > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "name: region '", name, "' is in use by ", it->second->users,
        " call(s); unregister it once they finish"));
  }
  mapped_bytes_ -= it->second->mapping->byte_size();
  dropped = std::move(it->second);
  regions_.erase(it);
  Changed();
  return absl::OkStatus();
}

std::vector<RegionStatusInfo> RegionRegistry::List() const {
  const absl::Time now = absl::Now();
  std::vector<RegionStatusInfo> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : regions_) {
    out.push_back(
        {.name = name,
         .key = entry->key,
         .offset = entry->offset,
         .byte_size = entry->mapping->byte_size(),
         .users = entry->users,
         .lease_left = std::max(absl::ZeroDuration(),
                                entry->last_used + limits_.lease - now)});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<RegionUse> RegionRegistry::Use(absl::string_view field,
                                              absl::string_view name) {
  absl::MutexLock lock(&mu_);
  const auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        field, ": no region named '", name.substr(0, kMaxRegionNameBytes),
        "' is registered (it may have expired: register it again)"));
  }
  ++it->second->users;
  it->second->last_used = absl::Now();
  return RegionUse(this, it->second);
}

void RegionRegistry::Release(Entry& entry) {
  absl::MutexLock lock(&mu_);
  --entry.users;
  // A long call must not leave its region expiring the moment it ends.
  entry.last_used = absl::Now();
}

void RegionRegistry::DropExpired(absl::Time now) {
  std::vector<std::shared_ptr<Entry>> dropped;  // unmapped after the lock
  absl::MutexLock lock(&mu_);
  absl::erase_if(regions_, [&](auto& named) {
    const Entry& entry = *named.second;
    if (entry.users > 0 || entry.last_used + limits_.lease > now) return false;
    mapped_bytes_ -= entry.mapping->byte_size();
    dropped.push_back(std::move(named.second));
    return true;
  });
  if (!dropped.empty()) Changed();
}

absl::Status RegionRegistry::CheckRoomForOneMore() const {
  if (static_cast<int>(regions_.size()) < limits_.max_regions) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("name: ", regions_.size(), " regions are registered, ",
                   "the most the server holds (--max_regions)"));
}

void RegionRegistry::Changed() {
  if (observer_) observer_(static_cast<int>(regions_.size()), mapped_bytes_);
}

}  // namespace klserve::server
