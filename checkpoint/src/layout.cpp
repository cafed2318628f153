#include "layout.hpp"

#include <algorithm>
#include <cstring>

#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::int64_t product(const Shape& s) {
  std::int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

}  // namespace

Shape Layout::grid() const {
  Shape g(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) g[d] = ceil_div(shape[d], chunk[d]);
  return g;
}

Shape Layout::inner_grid() const {
  Shape g(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) g[d] = chunk[d] / inner[d];
  return g;
}

std::int64_t Layout::inner_count() const {
  return product(inner_grid());
}

std::uint64_t Layout::inner_bytes() const {
  return static_cast<std::uint64_t>(product(inner)) * dtype_size(dtype);
}

Box Layout::chunk_box(const std::vector<std::int64_t>& cell) const {
  Box b(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d)
    b[d] = {cell[d] * chunk[d], std::min(shape[d], (cell[d] + 1) * chunk[d])};
  return b;
}

Box Layout::inner_box(const std::vector<std::int64_t>& cell, const std::vector<std::int64_t>& inner_cell) const {
  Box b(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::int64_t start = cell[d] * chunk[d] + inner_cell[d] * inner[d];
    b[d] = {start, start + inner[d]};
  }
  return b;
}

Shape save_chunk_shape(const Shape& shape, const NamedSharding& sharding) {
  Shape chunk(shape.size());
  std::int64_t blocks = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::int64_t n = sharding.num_shards(static_cast<int>(d));
    blocks *= n;
    chunk[d] = std::max<std::int64_t>(1, ceil_div(shape[d], n));
  }
  const std::int64_t replicas = sharding.mesh().size() / blocks;
  for (std::size_t d = 0; d < shape.size() && replicas > 1; ++d) {
    if (sharding.num_shards(static_cast<int>(d)) != 1 || shape[d] < 2) continue;
    chunk[d] = ceil_div(shape[d], std::min(replicas, shape[d]));
    break;
  }
  return chunk;
}

Shape plain_chunk_shape(const Shape& shape, std::int64_t ranks) {
  Shape chunk(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) chunk[d] = std::max<std::int64_t>(1, shape[d]);
  for (std::size_t d = 0; d < shape.size() && ranks > 1; ++d) {
    if (shape[d] < 2) continue;
    chunk[d] = ceil_div(shape[d], std::min(ranks, shape[d]));
    break;
  }
  return chunk;
}

Shape inner_chunk_shape(const Shape& chunk, std::size_t itemsize, std::int64_t target_bytes) {
  const std::size_t nd = chunk.size();
  Shape inner(nd, 1);
  if (nd == 0) return inner;
  const std::int64_t target = std::max<std::int64_t>(1, target_bytes / static_cast<std::int64_t>(itemsize));
  // The first dimension d whose trailing dimensions fit whole; it is cut by its largest divisor that fits.
  std::size_t d = 0;
  std::int64_t suffix = 1;
  for (;; ++d) {
    suffix = 1;
    for (std::size_t e = d + 1; e < nd; ++e) suffix *= chunk[e];
    if (suffix <= target || d + 1 == nd) break;
  }
  for (std::size_t e = d + 1; e < nd; ++e) inner[e] = chunk[e];
  std::int64_t best = 1;
  for (std::int64_t k = 1; k * k <= chunk[d]; ++k) {
    if (chunk[d] % k != 0) continue;
    if (k * suffix <= target) best = std::max(best, k);
    if ((chunk[d] / k) * suffix <= target) best = std::max(best, chunk[d] / k);
  }
  // A dimension with no divisor near the target (a prime, twice a prime) would make inner chunks of a few elements,
  // each with its crc32c and index entry (20 bytes: a file several times its data): take the whole dimension instead
  // while that stays within 256 times the target (1 GiB at the default 4 MiB). Inner chunks of 4 KiB or more stay
  // small (the overhead is at most 0.5%, and a reader reads runs of them with one call): a whole dimension there
  // would make a reader whose block meets a part of it read all of it.
  constexpr std::int64_t kSmallInnerBytes = 4096;
  if (best * suffix * 16 < target && best * suffix * static_cast<std::int64_t>(itemsize) < kSmallInnerBytes &&
      chunk[d] * suffix <= 256 * target)
    best = chunk[d];
  inner[d] = best;
  return inner;
}

std::string chunk_key(const std::vector<std::int64_t>& cell) {
  std::string key = "c";
  for (auto i : cell) {
    key += '/';
    key += std::to_string(i);
  }
  return key;
}

std::int64_t box_numel(const Box& b) {
  std::int64_t n = 1;
  for (const auto& r : b) n *= std::max<std::int64_t>(0, r.size());
  return n;
}

Box intersect(const Box& a, const Box& b) {
  Box out(a.size());
  for (std::size_t d = 0; d < a.size(); ++d) {
    out[d].start = std::max(a[d].start, b[d].start);
    out[d].stop = std::max(out[d].start, std::min(a[d].stop, b[d].stop));
  }
  return out;
}

Box whole(const Shape& shape) {
  Box b(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) b[d] = {0, shape[d]};
  return b;
}

void for_each_index(const Shape& grid, const std::function<void(const std::vector<std::int64_t>&)>& f) {
  for (auto g : grid)
    if (g <= 0) return;
  std::vector<std::int64_t> idx(grid.size(), 0);
  while (true) {
    f(idx);
    int d = static_cast<int>(grid.size()) - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < grid[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

void for_each_cell_meeting(const Box& box, const Shape& step, const Shape& grid,
                           const std::function<void(const std::vector<std::int64_t>&)>& f) {
  if (box_numel(box) == 0 && !box.empty()) return;
  std::vector<std::int64_t> lo(box.size()), n(box.size());
  for (std::size_t d = 0; d < box.size(); ++d) {
    lo[d] = box[d].start / step[d];
    const std::int64_t hi = std::min(grid[d], ceil_div(box[d].stop, step[d]));
    n[d] = hi - lo[d];
  }
  std::vector<std::int64_t> cell(box.size());
  for_each_index(n, [&](const std::vector<std::int64_t>& i) {
    for (std::size_t d = 0; d < i.size(); ++d) cell[d] = lo[d] + i[d];
    f(cell);
  });
}

void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& what,
              std::size_t itemsize) {
  const std::size_t nd = what.size();
  if (box_numel(what) == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, itemsize);
    return;
  }
  // Rows of the last dimension, copied one memcpy each.
  Shape rows(nd - 1);
  for (std::size_t d = 0; d + 1 < nd; ++d) rows[d] = what[d].size();
  const std::size_t row_bytes = static_cast<std::size_t>(what[nd - 1].size()) * itemsize;
  for_each_index(rows, [&](const std::vector<std::int64_t>& r) {
    std::int64_t so = 0, doff = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      const std::int64_t g = (d + 1 < nd ? what[d].start + r[d] : what[d].start);
      so = so * src_box[d].size() + (g - src_box[d].start);
      doff = doff * dst_box[d].size() + (g - dst_box[d].start);
    }
    std::memcpy(static_cast<char*>(dst) + doff * static_cast<std::int64_t>(itemsize),
                static_cast<const char*>(src) + so * static_cast<std::int64_t>(itemsize), row_bytes);
  });
}

bool contiguous_in(const Box& what, const Box& outer, std::int64_t& offset) {
  const std::size_t nd = what.size();
  // Dimensions before the first that is not a single index must be single; those after it must be whole.
  std::size_t k = 0;
  while (k < nd && what[k].size() == 1) ++k;
  for (std::size_t d = k + 1; d < nd; ++d)
    if (what[d].start != outer[d].start || what[d].stop != outer[d].stop) return false;
  offset = 0;
  for (std::size_t d = 0; d < nd; ++d) offset = offset * outer[d].size() + (what[d].start - outer[d].start);
  return true;
}

}  // namespace shardkit::checkpoint::detail
