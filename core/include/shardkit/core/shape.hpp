#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardkit {

/// Array dimensions.
using Shape = std::vector<std::int64_t>;
/// Array strides, in elements (as DLPack counts them).
using Strides = std::vector<std::int64_t>;

/// Row-major (C-contiguous) strides for `shape`. Strides past 64 bits, possible only for an empty shape such as
/// (0, 2^40, 2^40), saturate at INT64_MAX.
Strides contiguous_strides(const Shape& shape);
/// Product of the dimensions (1 for a 0-d shape, 0 when any dimension is 0).
/// @throws InvalidArgument on negative dimensions or when a non-empty shape has more elements than fit in 64 bits.
std::int64_t shape_numel(const Shape& shape);
/// "(2, 3)".
std::string shape_to_string(const Shape& shape);
/// Dimension `d` of an array of rank `ndim`, counted from the end when negative.
/// @throws InvalidArgument naming `what` when `d` is out of range.
int normalize_dim(int d, int ndim, const char* what);

}  // namespace shardkit
