#include "server/codec/call_regions.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace klserve::server {

absl::StatusOr<std::byte*> CallRegions::Input(absl::string_view field,
                                              const v1::RegionSlice& slice,
                                              int64_t element_size) {
  return Resolve(field, slice, element_size, /*output=*/false);
}

absl::StatusOr<std::byte*> CallRegions::Output(absl::string_view field,
                                               const v1::RegionSlice& slice,
                                               int64_t element_size) {
  return Resolve(field, slice, element_size, /*output=*/true);
}

absl::StatusOr<std::byte*> CallRegions::Resolve(absl::string_view field,
                                                const v1::RegionSlice& slice,
                                                int64_t element_size,
                                                bool output) {
  if (registry_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": shared-memory regions are off on this server (start ",
        "klserve with --shared_memory); send the bytes inline"));
  }
  if (!local_) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": only callers on this host (a Unix socket or loopback) may ",
        "name shared-memory regions"));
  }
  const RegionUse* region = nullptr;
  for (const RegionUse& held : held_) {
    if (held.name() == slice.region()) region = &held;
  }
  if (region == nullptr) {
    ASSIGN_OR_RETURN(
        RegionUse use,
        registry_->Use(absl::StrCat(field, ".region"), slice.region()));
    // An object already shrunk is refused before anything reads it.
    RETURN_IF_ERROR(use.CheckIntact());
    held_.push_back(std::move(use));
    region = &held_.back();
  }
  const int64_t size = region->byte_size();
  if (slice.offset() < 0 || slice.offset() > size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".offset: must be in [0, ", size,
                     "] (the region's byte_size), got ", slice.offset()));
  }
  if (slice.byte_size() < 0 || slice.byte_size() > size - slice.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".byte_size: must be in [0, ", size - slice.offset(),
        "] (what region '", slice.region(), "' holds past offset ",
        slice.offset(), "), got ", slice.byte_size()));
  }
  std::byte* data = region->data() + slice.offset();
  if (reinterpret_cast<uintptr_t>(data) % element_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".offset: the bytes must start at a multiple of ", element_size,
        " bytes (the element size) within the object, got ", "offset ",
        slice.offset(), " into region '", slice.region(), "'"));
  }
  const Span span{std::string(field), region, slice.offset(),
                  slice.offset() + slice.byte_size()};
  for (const Span& other : spans_) {
    // Outputs are written while the inputs are read: an output sharing
    // bytes with anything else of the call would corrupt it.
    if (!output || other.region != region || span.begin >= other.end ||
        other.begin >= span.end) {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": overlaps ", other.field, " in region '",
                     slice.region(), "' (bytes ", span.begin, " to ", span.end,
                     " against ", other.begin, " to ", other.end, ")"));
  }
  spans_.push_back(span);
  return data;
}

absl::StatusOr<const std::byte*> CallRegions::Copy(absl::string_view field,
                                                   const std::byte* data,
                                                   int64_t bytes) {
  if (bytes > max_copy_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": ", bytes, " bytes, over the limit of ",
                     max_copy_bytes_, " per tensor (--max_tensor_bytes)"));
  }
  copies_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes));
  std::memcpy(copies_.back().get(), data, bytes);
  return copies_.back().get();
}

absl::Status CallRegions::CheckIntact() const {
  for (const RegionUse& held : held_) RETURN_IF_ERROR(held.CheckIntact());
  return absl::OkStatus();
}

}  // namespace klserve::server
