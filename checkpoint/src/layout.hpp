#pragma once
// The geometry of a saved array: its chunk grid (one file per chunk), the inner chunks inside each file (the unit a
// load reads), boxes of global indices and the copies between them. Pure functions, no I/O.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardkit/core/dtype.hpp"
#include "shardkit/core/shape.hpp"
#include "shardkit/sharding/named_sharding.hpp"

namespace shardkit::checkpoint::detail {

/// Half-open ranges of global indices, one per dimension.
using Box = std::vector<IndexRange>;

/// An array's chunking: chunk files of `chunk` elements each (the edge ones clipped by the shape, padded in the
/// file), each cut into inner chunks of `inner` elements (which divide `chunk` exactly, as Zarr's sharding codec
/// requires).
struct Layout {
  Shape shape;
  DType dtype = DType::kFloat32;
  Shape chunk;
  Shape inner;

  int ndim() const noexcept { return static_cast<int>(shape.size()); }
  /// Chunk files per dimension: ceil(shape / chunk).
  Shape grid() const;
  /// Inner chunks per dimension of a chunk file: chunk / inner.
  Shape inner_grid() const;
  /// Inner chunks in one file.
  std::int64_t inner_count() const;
  /// Bytes of one encoded inner chunk's data (without its crc32c).
  std::uint64_t inner_bytes() const;
  /// The global box of chunk file `cell`, clipped to the shape.
  Box chunk_box(const std::vector<std::int64_t>& cell) const;
  /// The global box of inner chunk `inner_cell` of chunk file `cell`, unclipped (may pass the shape's edge).
  Box inner_box(const std::vector<std::int64_t>& cell, const std::vector<std::int64_t>& inner_cell) const;
  /// Bytes of a chunk file's index: inner_count() x (offset, size) as little-endian uint64, then a crc32c.
  std::uint64_t index_bytes() const { return static_cast<std::uint64_t>(inner_count()) * 16 + 4; }
};

/// The chunk shape a save uses for an array of `shape` cut by `sharding`: the save-time block (ceil(size / shards),
/// at least 1), refined along the first unsharded dimension into `replicas` pieces when each block has that many
/// copies, so that the copies split the writing.
Shape save_chunk_shape(const Shape& shape, const NamedSharding& sharding);
/// The same for a plain array held by `ranks` ranks.
Shape plain_chunk_shape(const Shape& shape, std::int64_t ranks);

/// The inner chunk shape for `chunk`: the trailing dimensions whole, the first dimension whose trailing ones fit in
/// `target_bytes` cut by its largest divisor that keeps within it (so inner chunks tile the chunk exactly), the
/// leading ones single.
Shape inner_chunk_shape(const Shape& chunk, std::size_t itemsize, std::int64_t target_bytes);

/// Zarr v3's default chunk key of a cell with separator '/': "c/1/0" ("c" for a 0-d array).
std::string chunk_key(const std::vector<std::int64_t>& cell);

/// The elements of a box (0 when any range is empty).
std::int64_t box_numel(const Box& b);
/// The intersection of two boxes (empty ranges where they miss).
Box intersect(const Box& a, const Box& b);
/// The box of a whole shape.
Box whole(const Shape& shape);

/// Calls f(cell) for every cell of the grid whose boxes of `step` elements (clipped to `extent`) meet `box`,
/// in row-major order.
void for_each_cell_meeting(const Box& box, const Shape& step, const Shape& grid,
                           const std::function<void(const std::vector<std::int64_t>&)>& f);
/// Calls f(index) for every multi-index of `grid`, row-major.
void for_each_index(const Shape& grid, const std::function<void(const std::vector<std::int64_t>&)>& f);

/// Copies the elements of global box `what` from a C-contiguous buffer holding global box `src_box` to one
/// holding `dst_box` (both must contain `what`).
void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& what,
              std::size_t itemsize);

/// True when box `what` is one contiguous range of a C-contiguous buffer holding `outer`; then `offset` is its first
/// element's index in that buffer.
bool contiguous_in(const Box& what, const Box& outer, std::int64_t& offset);

}  // namespace shardkit::checkpoint::detail
