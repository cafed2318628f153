#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardkit/core/array.hpp"
#include "shardkit/sharding/mesh.hpp"
#include "shardkit/sharding/partition_spec.hpp"

namespace shardkit {

/// A half-open index range [start, stop) along one dimension.
struct IndexRange {
  std::int64_t start = 0;
  std::int64_t stop = 0;
  std::int64_t size() const noexcept { return stop - start; }
  friend bool operator==(const IndexRange&, const IndexRange&) = default;
};

/// A mesh and a partition spec, as JAX's NamedSharding: which block of a global array each rank holds.
///
/// Dimension d is cut into n_d = product of the sizes of spec[d]'s axes shards; a rank's shard along d is the
/// row-major index of its coordinates on those axes. By default every size must divide evenly (as in JAX). With
/// `uneven` (an explicit opt-in), shards are ceil(size / n_d) long and the trailing ones shorter or empty, as
/// torch.chunk cuts.
class NamedSharding {
 public:
  /// @throws InvalidArgument when the spec names an axis the mesh lacks or names one twice.
  NamedSharding(Mesh mesh, PartitionSpec spec, bool uneven = false);

  const Mesh& mesh() const noexcept { return mesh_; }
  const PartitionSpec& spec() const noexcept { return spec_; }
  bool uneven() const noexcept { return uneven_; }

  /// Checks a global shape against the spec. @throws InvalidArgument when the spec is longer than the array's
  /// rank, a size is negative, or (unless uneven) a dimension does not divide evenly — naming the dimension, its
  /// size and the axes.
  void validate(const Shape& global) const;
  /// Number of shards along dimension d.
  std::int64_t num_shards(int d) const;
  /// The shard of `rank` along dimension d.
  std::int64_t shard_index(int d, int rank) const;
  /// The block shape of a shard (the largest one, for uneven shardings).
  Shape shard_shape(const Shape& global) const;
  /// The block `rank` holds: one range per dimension. @throws InvalidArgument as validate() does, or for a rank
  /// outside the mesh.
  std::vector<IndexRange> index(const Shape& global, int rank) const;
  /// Shape of the block `rank` holds.
  Shape local_shape(const Shape& global, int rank) const;
  /// Mesh axes the spec does not name: the array is replicated over them.
  std::vector<std::string> replicated_axes() const;
  /// True when `rank` holds the first copy of its block (coordinate 0 on every replicated axis).
  bool is_primary(int rank) const;
  /// True when no dimension is sharded.
  bool fully_replicated() const;

  /// Same mesh, same spec (after dropping trailing None entries), same evenness.
  friend bool operator==(const NamedSharding& a, const NamedSharding& b);
  /// "NamedSharding(mesh=Mesh(x=2), spec=P('x'))".
  std::string to_string() const;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
  bool uneven_;
};

}  // namespace shardkit
