#pragma once

#include <optional>
#include <string>

#include "shardkit/collectives/token.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/sharding/named_sharding.hpp"

namespace shardkit {

/// A global array cut across a mesh: its global shape, its sharding, and this rank's block (on the host or a GPU).
class ShardedArray {
 public:
  /// @throws InvalidArgument when the sharding does not fit the global shape or the local block has the wrong
  ///         shape for this rank.
  ShardedArray(Shape global_shape, NamedSharding sharding, Array local);

  const Shape& shape() const noexcept { return shape_; }
  const NamedSharding& sharding() const noexcept { return sharding_; }
  const Mesh& mesh() const noexcept { return sharding_.mesh(); }
  const PartitionSpec& spec() const noexcept { return sharding_.spec(); }
  const Array& local() const noexcept { return local_; }
  Array& local() noexcept { return local_; }
  DType dtype() const noexcept { return local_.dtype(); }
  Device device() const noexcept { return local_.device(); }
  int ndim() const noexcept { return static_cast<int>(shape_.size()); }
  /// "ShardedArray(shape=(8, 4), dtype=float32, sharding=...)".
  std::string describe() const;

 private:
  Shape shape_;
  NamedSharding sharding_;
  Array local_;
};

/// Cuts the global array held by `root` into blocks and sends each rank its block (a broadcast when the sharding
/// replicates everything, a scatter otherwise). Other ranks may pass an empty Array: the shape and dtype come from
/// the root. Blocks land on `device` (default: the Runtime's device, the bound GPU or the CPU). Collective.
ShardedArray distribute(const Array& global, const NamedSharding& sharding, int root = 0,
                        std::optional<Device> device = std::nullopt);
/// Wraps this rank's block as a ShardedArray without communication (the caller vouches for the other ranks).
ShardedArray from_local(Array local, Shape global_shape, const NamedSharding& sharding);
/// The global array on `root` (on the host); an empty Array elsewhere. Collective.
Array gather(const ShardedArray& x, int root = 0);
/// The global array on every rank (on the host), as JAX's multihost_utils.process_allgather. Collective.
Array process_allgather(const ShardedArray& x);
/// The same global array with another sharding of the same mesh, with at most one collective (see plan_reshard in
/// reshard.hpp): none when every rank already holds its target block (a local slice where the target only cuts
/// finer); one all_gather(v) over the mesh axes that must go when the blocks along them tile the target block
/// (shard -> replicate); otherwise one all_to_all-v over the mesh in which each rank receives only the part of its
/// target block it lacks, each element from one holder. Even and uneven shardings alike. Collective.
/// @throws InvalidArgument when the target is on another mesh or does not fit the array's shape.
ShardedArray reshard(const ShardedArray& x, const NamedSharding& target);

/// A text picture of which ranks hold which block (the first two dimensions as a grid).
std::string visualize_sharding(const Shape& global_shape, const NamedSharding& sharding);
inline std::string visualize_sharding(const ShardedArray& x) { return visualize_sharding(x.shape(), x.sharding()); }

}  // namespace shardkit
