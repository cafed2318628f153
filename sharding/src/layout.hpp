#pragma once

// Local blocks in the layout the backends take.

#include "shardkit/core/array.hpp"

namespace shardkit::detail {

/// Copies `x` (any layout) into a new contiguous array on the same device; `x` itself when it is contiguous.
Array packed(const Array& x);

}  // namespace shardkit::detail
