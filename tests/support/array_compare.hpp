#pragma once

// Element-wise comparison of arrays, for tests and for the examples that check their result against a reference.

#include "shardkit/core/array.hpp"

namespace shardkit {

/// True when both arrays have the same shape and dtype and every element is within atol + rtol * |b| (exact
/// comparison for integer and bool types; NaN is never close). Waits for both.
bool allclose(const Array& a, const Array& b, double rtol = 1e-5, double atol = 1e-8);
/// Largest |a - b| over all elements divided by the largest |b| (floored at 1e-300 so that an all-zero reference
/// gives a finite ratio); NaN differences count as infinite. Waits for both.
/// @throws InvalidArgument when the shapes or dtypes differ.
double max_relative_error(const Array& a, const Array& b);

}  // namespace shardkit
