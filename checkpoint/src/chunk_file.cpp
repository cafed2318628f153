#include "chunk_file.hpp"

#include <bit>
#include <cstring>

#include "shardkit/core/crc32c.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {

static_assert(std::endian::native == std::endian::little, "the chunk files are little-endian, as this host must be");

namespace {

constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

std::string cell_text(const std::vector<std::int64_t>& c) {
  std::string s = "(";
  for (std::size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + std::to_string(c[i]);
  return s + (c.size() == 1 ? ",)" : ")");
}

}  // namespace

EncodedChunk encode_chunk(const Layout& layout, const std::vector<std::int64_t>& cell, const void* block,
                          const Box& block_box) {
  EncodedChunk out;
  const std::int64_t n = layout.inner_count();
  const std::uint64_t bytes = layout.inner_bytes();
  const std::size_t itemsize = dtype_size(layout.dtype);
  const Box extent = whole(layout.shape);
  out.crcs.reserve(static_cast<std::size_t>(n));
  out.index.reserve(static_cast<std::size_t>(2 * n) + 1);
  std::uint64_t offset = 0;
  std::uint32_t file_crc = 0;
  for_each_index(layout.inner_grid(), [&](const std::vector<std::int64_t>& ic) {
    const Box ibox = layout.inner_box(cell, ic);
    const Box clipped = intersect(ibox, extent);
    if (box_numel(clipped) == 0 && !clipped.empty()) {
      out.index.push_back(kEmpty);
      out.index.push_back(kEmpty);
      return;
    }
    const char* data = nullptr;
    std::int64_t first = 0;
    if (clipped == ibox && contiguous_in(ibox, block_box, first)) {
      data = static_cast<const char*>(block) + first * static_cast<std::int64_t>(itemsize);
    } else {
      auto buf = std::make_unique<char[]>(bytes);
      std::memset(buf.get(), 0, bytes);
      copy_box(block, block_box, buf.get(), ibox, clipped, itemsize);
      data = buf.get();
      out.staging.push_back(std::move(buf));
    }
    const std::uint32_t crc = crc32c(data, bytes);
    out.crcs.push_back(crc);
    out.pieces.push_back({const_cast<char*>(data), bytes});
    out.pieces.push_back({&out.crcs.back(), 4});
    file_crc = crc32c(&out.crcs.back(), 4, crc32c_combine(file_crc, crc, bytes));
    out.index.push_back(offset);
    out.index.push_back(bytes + 4);
    offset += bytes + 4;
  });
  const std::uint64_t index_bytes = static_cast<std::uint64_t>(n) * 16;
  const std::uint32_t index_crc = crc32c(out.index.data(), index_bytes);
  // The index's crc32c rides in the index vector's spare slot (low 4 bytes, little-endian).
  out.index.push_back(index_crc);
  out.pieces.push_back({out.index.data(), index_bytes + 4});
  file_crc = crc32c(&out.index[static_cast<std::size_t>(2 * n)], 4, crc32c_combine(file_crc, index_crc, index_bytes));
  out.size = offset + index_bytes + 4;
  out.crc32c = file_crc;
  return out;
}

ChunkReader::ChunkReader(const Layout& layout, std::vector<std::int64_t> cell, std::string path, std::string key)
    : layout_(layout), cell_(std::move(cell)), key_(std::move(key)) {
  if (!exists(path))
    throw BackendError("checkpoint", 0, "chunk file '" + path + "' of array '" + key_ + "' (chunk " + cell_text(cell_) +
                                            ") is missing");
  fd_ = open_read(path);
  const std::uint64_t size = file_size(fd_);
  const std::uint64_t index_bytes = layout_.index_bytes();
  if (size < index_bytes) damaged("the file is shorter (" + std::to_string(size) + " bytes) than its index", nullptr);
  const auto n = static_cast<std::size_t>(layout_.inner_count());
  index_.resize(2 * n + 1);
  read_at(fd_, index_.data(), index_bytes, size - index_bytes);
  std::uint32_t stored = 0;
  std::memcpy(&stored, &index_[2 * n], 4);
  if (crc32c(index_.data(), 16 * n) != stored) damaged("its index fails its crc32c check", nullptr);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t off = index_[2 * i], nb = index_[2 * i + 1];
    if (off == kEmpty && nb == kEmpty) continue;
    if (nb != layout_.inner_bytes() + 4 || off > size - index_bytes || nb > size - index_bytes - off)
      damaged("its index names bytes outside the file or of the wrong size", nullptr);
  }
}

void ChunkReader::damaged(const std::string& why, const std::vector<std::int64_t>* inner) const {
  std::string where = "chunk file '" + fd_.path() + "' of array '" + key_ + "' (chunk " + cell_text(cell_);
  if (inner != nullptr) where += ", inner chunk " + cell_text(*inner);
  throw BackendError("checkpoint", 0, where + ") is damaged: " + why);
}

void ChunkReader::read(const Box& want, void* dst, const Box& dst_box) {
  const std::size_t itemsize = dtype_size(layout_.dtype);
  const std::uint64_t bytes = layout_.inner_bytes();
  const Box mine = intersect(want, layout_.chunk_box(cell_));
  if (box_numel(mine) == 0 && !mine.empty()) return;
  // Inner cells of this chunk that `mine` meets: work in coordinates relative to the chunk's origin.
  Box local(mine.size());
  for (std::size_t d = 0; d < mine.size(); ++d) {
    const std::int64_t origin = cell_[d] * layout_.chunk[d];
    local[d] = {mine[d].start - origin, mine[d].stop - origin};
  }
  const Shape inner_grid = layout_.inner_grid();
  for_each_cell_meeting(local, layout_.inner, inner_grid, [&](const std::vector<std::int64_t>& ic) {
    std::int64_t linear = 0;
    for (std::size_t d = 0; d < ic.size(); ++d) linear = linear * inner_grid[d] + ic[d];
    const std::uint64_t off = index_[2 * static_cast<std::size_t>(linear)];
    const Box ibox = layout_.inner_box(cell_, ic);
    const Box part = intersect(ibox, mine);
    if (off == kEmpty) {  // stored empty: Zarr's fill value (zero)
      staging_.assign(bytes, 0);
      copy_box(staging_.data(), ibox, dst, dst_box, part, itemsize);
      return;
    }
    std::uint32_t stored = 0;
    std::int64_t first = 0;
    if (part == ibox && contiguous_in(ibox, dst_box, first)) {
      // The whole inner chunk lands as one run of the destination: read it there.
      char* at = static_cast<char*>(dst) + first * static_cast<std::int64_t>(itemsize);
      read_at(fd_, {iovec{at, bytes}, iovec{&stored, 4}}, off);
      if (crc32c(at, bytes) != stored) damaged("its data fails its crc32c check", &ic);
      return;
    }
    staging_.resize(bytes);
    read_at(fd_, {iovec{staging_.data(), bytes}, iovec{&stored, 4}}, off);
    if (crc32c(staging_.data(), bytes) != stored) damaged("its data fails its crc32c check", &ic);
    copy_box(staging_.data(), ibox, dst, dst_box, part, itemsize);
  });
}

}  // namespace shardkit::checkpoint::detail
