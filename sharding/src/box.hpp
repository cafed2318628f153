#pragma once

// Boxes (one index range per dimension) of a global array and the views of arrays they cover: what distribute,
// gather and reshard cut blocks with.

#include <cstdint>

#include "shardkit/core/array.hpp"
#include "shardkit/sharding/reshard.hpp"

namespace shardkit::detail {

inline std::int64_t numel_of(const Box& b) {
  std::int64_t n = 1;
  for (const auto& r : b) n *= r.size();
  return n;
}

inline Shape shape_of(const Box& b) {
  Shape s;
  for (const auto& r : b) s.push_back(r.size());
  return s;
}

/// The view of `block`, which covers `where` of the global array, that `part` (inside `where`) covers.
inline Array view_of(const Array& block, const Box& where, const Box& part) {
  Array v = block;
  for (std::size_t d = 0; d < part.size(); ++d)
    v = v.slice(static_cast<int>(d), part[d].start - where[d].start, part[d].stop - where[d].start);
  return v;
}

/// The view of a global array that `part` covers.
inline Array block_of(const Array& global, const Box& part) {
  Array v = global;
  for (std::size_t d = 0; d < part.size(); ++d) v = v.slice(static_cast<int>(d), part[d].start, part[d].stop);
  return v;
}

}  // namespace shardkit::detail
