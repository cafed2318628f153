#pragma once

// Pinned host buffers for moving GPU data through an MPI library that is not CUDA-aware. Blocks are pooled by
// power-of-two size class and reused: no allocation on the hot path after warm-up. The idle blocks kept are capped
// (SHARDKIT_STAGING_POOL_MB, 256 MiB by default): pinned memory is locked memory, and a run that once moved a large
// message must not hold it for good.

#include <cstddef>

#include "shardkit/core/array.hpp"

namespace shardkit::detail {

/// A pinned host array with the shape and dtype of `like`, from the process-wide pool. The block returns to the
/// pool when the last Array sharing it is destroyed (or is freed, when keeping it would pass the cap).
Array pinned_like(const Array& like);

/// Number of pinned blocks allocated so far (for tests of the pool's reuse).
std::size_t pinned_blocks_allocated();
/// Bytes of pinned blocks held idle by the pool.
std::size_t pinned_idle_bytes();
/// Sets the cap on idle bytes (freeing idle blocks above it); returns the previous cap.
std::size_t set_pinned_pool_cap(std::size_t bytes);

}  // namespace shardkit::detail
