#pragma once

// Element-wise helpers on local arrays (host loops, or CUDA kernels for device arrays), used by examples and tests.

#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit {

/// x *= factor, element-wise, in place, for floating and complex dtypes (float16/bfloat16 computed in float32).
/// CUDA arrays are scaled on `stream` (nullptr: the library stream, synchronised before returning).
/// @throws InvalidArgument for integer or bool dtypes, or a read-only array.
void scale(Array& x, double factor, StreamHandle stream = nullptr);

/// y += x, element-wise, in place (same shape and dtype; floating, complex or integer dtypes). CUDA arrays are
/// handled on `stream` (nullptr: the library stream, synchronised before returning).
/// @throws InvalidArgument on shape or dtype mismatch, bool dtype, a read-only y, or arrays on different devices.
void add_into(Array& y, const Array& x, StreamHandle stream = nullptr);

}  // namespace shardkit
