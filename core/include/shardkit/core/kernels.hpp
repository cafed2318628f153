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

/// The integer dtype of the order keys of `dtype`: int32 for float32, int64 for float64.
/// @throws InvalidArgument for other dtypes.
DType order_key_dtype(DType dtype);

/// keys[i] = the order key of x[i]: a signed integer of x's width whose integer order is the order of the floats
/// (-0 just below +0), every NaN the largest key when `nan_high`, else the smallest. An integer max (min) over ranks
/// of the keys of x, turned back by from_order_keys, is the float max (min) with NaN propagated from any rank, which
/// the NCCL backend uses (NCCL's float max and min drop NaN). `x` float32 or float64, `keys` of order_key_dtype, both
/// contiguous, with as many elements, on one device; `keys` may be x's own memory. CUDA arrays: enqueued on `stream` (required; the
/// caller orders and waits for it). Host arrays: computed now.
/// @throws InvalidArgument for other dtypes, counts or layouts, or a CUDA array without a stream.
void to_order_keys(const Array& x, Array& keys, bool nan_high, StreamHandle stream = nullptr);
/// x[i] = the float whose order key is keys[i] (a NaN for a NaN's key); the inverse of to_order_keys, with the same
/// requirements; `x` may be the keys' own memory.
void from_order_keys(const Array& keys, Array& x, StreamHandle stream = nullptr);

}  // namespace shardkit
