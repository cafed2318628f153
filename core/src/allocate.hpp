#pragma once

// Private to core: the storage behind Array::empty.

#include <cstddef>
#include <memory>

#include "shardkit/core/device.hpp"

namespace shardkit::detail {

/// Host buffers from this many bytes are mappings of their own, 2 MiB aligned and advised for transparent huge pages,
/// and kept for reuse once freed (allocate.cpp says why and how many).
inline constexpr std::size_t kLargeHostBytes = std::size_t{2} << 20;
/// Freed large host buffers are kept for reuse up to this many bytes in all.
inline constexpr std::size_t kCachedHostBytes = std::size_t{256} << 20;
#if defined(__SANITIZE_ADDRESS__)
/// Under AddressSanitizer none are kept: a use after free then faults on the unmapped pages.
inline constexpr bool kKeepFreedHostBuffers = false;
#else
inline constexpr bool kKeepFreedHostBuffers = true;
#endif

/// Uninitialised storage of at least `bytes` bytes (never null, even for 0 bytes) on `device`, freed when the last
/// owner lets go. Host storage is 64-byte aligned; large host buffers (kLargeHostBytes) are 2 MiB aligned.
/// @throws BackendError when the memory cannot be had (or, for CUDA kinds, when there is no GPU).
std::shared_ptr<void> allocate(std::size_t bytes, Device device);

/// The bytes of freed large host buffers kept for reuse now.
std::size_t cached_host_bytes();

}  // namespace shardkit::detail
