#pragma once

// Private to core: the storage behind Array::empty.

#include <cstddef>
#include <memory>

#include "shardkit/core/device.hpp"

namespace shardkit::detail {

/// Uninitialised storage of at least `bytes` bytes (never null, even for 0 bytes) on `device`, freed when the last
/// owner lets go. Host storage is 64-byte aligned; large host buffers are 2 MiB aligned and advised for huge pages.
/// @throws BackendError when the memory cannot be had (or, for CUDA kinds, when there is no GPU).
std::shared_ptr<void> allocate(std::size_t bytes, Device device);

}  // namespace shardkit::detail
