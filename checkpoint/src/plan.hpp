#pragma once
// A save's plan: for each entry, what every rank works out alike (its Zarr metadata, its chunk grid and inner
// chunks, which rank writes each chunk file) and this rank's part.

#include <cstdint>
#include <string>
#include <vector>

#include "layout.hpp"
#include "metadata.hpp"
#include "shardkit/checkpoint/checkpoint.hpp"

namespace shardkit::checkpoint::detail {

// Everything about one entry every rank works out alike, and this rank's part: the chunk files it writes and the
// host copy of its block they come from.
struct Plan {
  ArrayMeta meta;
  const Entry* entry = nullptr;           // the caller's, until staged
  const ShardedArray* sharded = nullptr;  // likewise
  std::vector<std::vector<std::int64_t>> mine;
  Array host;
  Box block_box;
};

/// Plans every entry over `comm` (the same on every rank; no communication): keys checked (Zarr can name each
/// segment; none twice; none both an array and a group), chunk grids and inner chunks, and the chunk files this rank
/// writes (the holders of a block take its chunks in turn).
/// @throws InvalidArgument for a bad or repeated key, or a ShardedArray whose mesh is not over `comm`.
std::vector<Plan> plan(const std::vector<Entry>& entries, const Communicator& comm, std::int64_t chunk_bytes);

/// A digest of what every rank of a save must agree on (keys, shapes, dtypes, shardings, options), to compare.
std::string plan_digest(const std::vector<Plan>& plans, const SaveOptions& o);

}  // namespace shardkit::checkpoint::detail
