#pragma once
// One chunk file (a Zarr v3 `sharding_indexed` shard): its inner chunks in row-major order, each its bytes then
// their crc32c, then the index (offset and size of each inner chunk as little-endian uint64; 2^64-1 twice for an
// inner chunk wholly past the array's edge) and the index's crc32c.

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "files.hpp"
#include "layout.hpp"

namespace shardkit::checkpoint::detail {

/// What write_chunk_file wrote.
struct WrittenChunk {
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;  ///< of the whole file
};

/// Writes chunk file `cell` of `layout` as the new file `path` (fsynced with `sync`) from a C-contiguous host buffer
/// holding global box `block_box` (which must contain the chunk's box), reading the buffer once.
WrittenChunk write_chunk_file(const std::string& path, const Layout& layout, const std::vector<std::int64_t>& cell,
                              const void* block, const Box& block_box, bool sync);

/// A chunk file opened to read: its index, checked.
class ChunkReader {
 public:
  /// Opens `path` (chunk `cell` of array `key`) and reads and checks its index.
  /// @throws BackendError naming the file, array and chunk when it is missing, short or its index damaged.
  ChunkReader(const Layout& layout, std::vector<std::int64_t> cell, std::string path, std::string key);
  /// Copies the part of global box `want` inside this chunk into a C-contiguous buffer holding global box `dst_box`
  /// (zeros for inner chunks stored empty), reading only the inner chunks `want` meets and checking each one's crc32c.
  void read(const Box& want, void* dst, const Box& dst_box);

 private:
  [[noreturn]] void damaged(const std::string& why, const std::vector<std::int64_t>* inner) const;
  const Layout& layout_;
  std::vector<std::int64_t> cell_;
  std::string key_;
  Fd fd_;
  std::vector<std::uint64_t> index_;
  std::vector<char> staging_;
};

}  // namespace shardkit::checkpoint::detail
