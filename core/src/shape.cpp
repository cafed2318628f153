#include "shardkit/core/shape.hpp"

#include <algorithm>

#include "shardkit/core/error.hpp"

namespace shardkit {

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // Past 64 bits only for an empty shape (every stride of a non-empty one is at most its element count), whose
    // strides address nothing: saturate rather than overflow.
    if (__builtin_mul_overflow(s, std::max<std::int64_t>(shape[i], 1), &s)) s = INT64_MAX;
  }
  return strides;
}

std::int64_t shape_numel(const Shape& shape) {
  bool empty = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    SHARDKIT_CHECK_GE(shape[i], 0, "negative dimension ", i, " in shape ", shape_to_string(shape));
    empty = empty || shape[i] == 0;
  }
  // A zero anywhere makes the array empty, whatever the order of the dimensions.
  if (empty) return 0;
  std::int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n))
      throw InvalidArgument("shape " + shape_to_string(shape) + " has more elements than fit in 64 bits");
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

int normalize_dim(int d, int ndim, const char* what) {
  if (d < 0) d += ndim;
  SHARDKIT_CHECK(d >= 0 && d < ndim, what, ": dimension ", d, " out of range for an array of rank ", ndim);
  return d;
}

}  // namespace shardkit
