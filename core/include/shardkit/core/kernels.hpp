#pragma once

// Element-wise helpers on local arrays (host loops, or CUDA kernels for device arrays), used by examples and tests.

#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit {

/// x *= factor, element-wise, in place, for floating and complex dtypes (float16/bfloat16 computed in float32).
/// CUDA arrays are scaled on `stream` (nullptr: the library stream, synchronised before returning).
/// @throws InvalidArgument for integer or bool dtypes, or a read-only array.
void scale(Array& x, double factor, StreamHandle stream = nullptr);

}  // namespace shardkit
