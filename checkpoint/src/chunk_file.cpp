#include "chunk_file.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "shardkit/core/crc32c.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::checkpoint::detail {

static_assert(std::endian::native == std::endian::little, "the chunk files are little-endian, as this host must be");

namespace {

constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

// Chunk files are written and read about this much at a time, each slice's crc32c computed while it is in the cache.
constexpr std::uint64_t kSlice = std::uint64_t{256} << 10;

std::string cell_text(const std::vector<std::int64_t>& c) {
  std::string s = "(";
  for (std::size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + std::to_string(c[i]);
  return s + (c.size() == 1 ? ",)" : ")");
}

}  // namespace

WrittenChunk write_chunk_file(const std::string& path, const Layout& layout, const std::vector<std::int64_t>& cell,
                              const void* block, const Box& block_box, bool sync) {
  const std::int64_t n = layout.inner_count();
  const std::uint64_t bytes = layout.inner_bytes();
  const std::size_t itemsize = dtype_size(layout.dtype);
  const Box extent = whole(layout.shape);
  NewFile file(path);
  std::vector<std::uint64_t> index;
  index.reserve(static_cast<std::size_t>(2 * n) + 1);
  std::vector<std::uint32_t> crcs(static_cast<std::size_t>(n));  // where the iovecs point
  // Written in batches of about kSlice bytes, each inner chunk's crc32c computed a slice at a time just before its
  // batch is written, while the slice is in the cache (the block is read from memory once). Inner chunks that are no
  // one stretch of the block (padded at the array's edge, cut across its rows) are staged: small ones side by side
  // in the batch's staging, a large one alone.
  std::unique_ptr<char[]> staging;  // not zeroed: every byte staged is written first
  std::uint64_t staging_size = 0;
  std::vector<iovec> batch;
  std::uint64_t batch_bytes = 0, staged = 0, offset = 0;
  auto flush = [&] {
    file.append(batch);
    batch.clear();
    batch_bytes = 0;
    staged = 0;
  };
  std::uint32_t file_crc = 0;
  std::size_t k = 0;
  for_each_index(layout.inner_grid(), [&](const std::vector<std::int64_t>& ic) {
    const Box ibox = layout.inner_box(cell, ic);
    const Box clipped = intersect(ibox, extent);
    if (box_numel(clipped) == 0 && !clipped.empty()) {
      index.push_back(kEmpty);
      index.push_back(kEmpty);
      return;
    }
    const char* data = nullptr;
    std::int64_t first = 0;
    const bool large = bytes > kSlice;
    if (clipped == ibox && contiguous_in(ibox, block_box, first)) {
      data = static_cast<const char*>(block) + first * static_cast<std::int64_t>(itemsize);
    } else {
      if (large || staged + bytes > kSlice) flush();  // nothing in the batch points into the staging any more
      if (staging_size < std::max(bytes, kSlice)) {   // once: bytes is the same for every inner chunk
        staging_size = std::max(bytes, kSlice);
        staging.reset(new char[staging_size]);
      }
      char* buf = staging.get() + staged;
      if (clipped != ibox) std::memset(buf, 0, bytes);  // Zarr pads edge chunks with the fill value
      copy_box(block, block_box, buf, ibox, clipped, itemsize);
      staged += bytes;
      data = buf;
    }
    std::uint32_t crc = 0;
    for (std::uint64_t o = 0; o < bytes; o += kSlice) {
      const std::uint64_t len = std::min(kSlice, bytes - o);
      crc = crc32c(data + o, len, crc);
      batch.push_back({const_cast<char*>(data + o), len});
      batch_bytes += len;
      if (batch_bytes >= kSlice && o + len < bytes) flush();
    }
    crcs[k] = crc;
    batch.push_back({&crcs[k], 4});
    batch_bytes += 4;
    file_crc = crc32c(&crcs[k], 4, crc32c_combine(file_crc, crc, bytes));
    ++k;
    index.push_back(offset);
    index.push_back(bytes + 4);
    offset += bytes + 4;
    if (batch_bytes >= kSlice || (large && staged > 0)) flush();
  });
  const std::uint64_t index_bytes = static_cast<std::uint64_t>(n) * 16;
  const std::uint32_t index_crc = crc32c(index.data(), index_bytes);
  // The index's crc32c rides in the index vector's spare slot (low 4 bytes, little-endian).
  index.push_back(index_crc);
  batch.push_back({index.data(), index_bytes + 4});
  flush();
  file.finish(sync);
  file_crc = crc32c(&index[static_cast<std::size_t>(2 * n)], 4, crc32c_combine(file_crc, index_crc, index_bytes));
  return {offset + index_bytes + 4, file_crc};
}

ChunkReader::ChunkReader(const Layout& layout, std::vector<std::int64_t> cell, std::string path, std::string key)
    : layout_(layout), cell_(std::move(cell)), key_(std::move(key)) {
  if (!exists(path))
    throw BackendError("checkpoint", 0,
                       "chunk file '" + path + "' of array '" + key_ + "' (chunk " + cell_text(cell_) + ") is missing");
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
  // Every inner chunk lands straight in the destination where it is one stretch of it, in staging otherwise (then
  // copied). Its crc32c is checked kSlice bytes at a time, each read just before, while it is in the cache: small
  // inner chunks stored one after another are read as one run of at most kSlice bytes, large ones kSlice at a time.
  constexpr std::size_t kRunChunks = 256;  // two iovecs each: within IOV_MAX
  struct Piece {
    std::vector<std::int64_t> ic;
    char* data;
    bool staged;
    Box ibox, part;
  };
  std::vector<Piece> run;
  std::vector<iovec> iov;
  std::vector<std::uint32_t> crcs(kRunChunks);
  std::uint64_t run_start = 0, run_end = 0, staged_bytes = 0;
  auto check_and_place = [&](const Piece& p, std::uint32_t crc, std::uint32_t stored) {
    if (crc != stored) damaged("its data fails its crc32c check", &p.ic);
    if (p.staged) copy_box(p.data, p.ibox, dst, dst_box, p.part, itemsize);
  };
  auto flush = [&] {
    if (run.empty()) return;
    read_at(fd_, iov, run_start);
    for (std::size_t i = 0; i < run.size(); ++i) check_and_place(run[i], crc32c(run[i].data, bytes), crcs[i]);
    run.clear();
    iov.clear();
    staged_bytes = 0;
  };
  const Shape inner_grid = layout_.inner_grid();
  for_each_cell_meeting(local, layout_.inner, inner_grid, [&](const std::vector<std::int64_t>& ic) {
    std::int64_t linear = 0;
    for (std::size_t d = 0; d < ic.size(); ++d) linear = linear * inner_grid[d] + ic[d];
    const std::uint64_t off = index_[2 * static_cast<std::size_t>(linear)];
    Piece p{ic, nullptr, false, layout_.inner_box(cell_, ic), {}};
    p.part = intersect(p.ibox, mine);
    if (off == kEmpty) {  // stored empty: Zarr's fill value (zero)
      flush();
      staging_.assign(bytes, 0);
      copy_box(staging_.data(), p.ibox, dst, dst_box, p.part, itemsize);
      return;
    }
    std::int64_t first = 0;
    p.staged = !(p.part == p.ibox && contiguous_in(p.ibox, dst_box, first));
    if (bytes > kSlice) {  // alone, a slice at a time
      flush();
      if (p.staged && staging_.size() < bytes) staging_.resize(bytes);
      p.data = p.staged ? staging_.data() : static_cast<char*>(dst) + first * static_cast<std::int64_t>(itemsize);
      std::uint32_t crc = 0, stored = 0;
      for (std::uint64_t o = 0; o < bytes; o += kSlice) {
        const std::uint64_t n = std::min(kSlice, bytes - o);
        if (o + n < bytes)
          read_at(fd_, p.data + o, n, off + o);
        else
          read_at(fd_, {iovec{p.data + o, n}, iovec{&stored, 4}}, off + o);
        crc = crc32c(p.data + o, n, crc);
      }
      check_and_place(p, crc, stored);
      return;
    }
    if (!run.empty() && (off != run_end || run.size() == kRunChunks || run_end - run_start + bytes > kSlice)) flush();
    if (run.empty()) run_start = run_end = off;
    if (p.staged) {
      if (staged_bytes == 0 && staging_.size() < kSlice) staging_.resize(kSlice);  // nothing points into it yet
      p.data = staging_.data() + staged_bytes;
      staged_bytes += bytes;
    } else {
      p.data = static_cast<char*>(dst) + first * static_cast<std::int64_t>(itemsize);
    }
    iov.push_back({p.data, bytes});
    iov.push_back({&crcs[run.size()], 4});
    run.push_back(std::move(p));
    run_end += bytes + 4;
  });
  flush();
}

}  // namespace shardkit::checkpoint::detail
