#pragma once

// Pinned host buffers for moving GPU data through an MPI library that is not CUDA-aware. Blocks are pooled by
// power-of-two size class and reused: no allocation on the hot path after warm-up.

#include <cstddef>

#include "shardkit/core/array.hpp"

namespace shardkit::detail {

/// A pinned host array with the shape and dtype of `like`, from the process-wide pool. The block returns to the
/// pool when the last Array sharing it is destroyed.
Array pinned_like(const Array& like);

/// Number of pinned blocks allocated so far (for tests of the pool's reuse).
std::size_t pinned_blocks_allocated();

}  // namespace shardkit::detail
