#pragma once

#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "shardkit/collectives/ops.hpp"
#include "shardkit/collectives/token.hpp"
#include "shardkit/sharding/axis_plan.hpp"
#include "shardkit/sharding/sharded_array.hpp"

namespace shardkit {

/// What a shard_map body can call: the mesh, its axis indices, and collectives over named axes (one name or a
/// tuple, major to minor). Shapes follow JAX's rules. Every collective is collective over the ranks that differ
/// along the named axes. Each runs the plan of plan_axis (the traced shard_map body runs the same plans).
class ShardContext {
 public:
  explicit ShardContext(Mesh mesh) : mesh_(std::move(mesh)) {}

  const Mesh& mesh() const noexcept { return mesh_; }
  /// Row-major index of this rank over `axes`.
  std::int64_t axis_index(const Axes& axes) const { return mesh_.axis_index(axes); }
  /// Product of the sizes of `axes`.
  std::int64_t axis_size(const Axes& axes) const { return mesh_.axis_size(axes); }

  /// Sum over the group (bool counts, as int32; see axis_reduction).
  Array psum(const Array& x, const Axes& axes);
  /// Mean over the group. Floating and complex dtypes keep theirs; integers and bool give JAX's psum(x) / n with
  /// 64-bit types enabled: float64 for int64 and uint64, float32 for the others.
  Array pmean(const Array& x, const Axes& axes);
  /// Maximum / minimum over the group (bool: logical or / and).
  Array pmax(const Array& x, const Axes& axes);
  Array pmin(const Array& x, const Axes& axes);
  /// Untiled: a new dimension of size axis_size at `dim`, stacking the members' blocks; tiled: the blocks
  /// concatenated along the existing dimension `dim`.
  Array all_gather(const Array& x, const Axes& axes, int dim = 0, bool tiled = false);
  /// Sum over the group, then this rank keeps its part of `scatter_dim`: untiled, x.shape[scatter_dim] must equal
  /// axis_size and that dimension is removed; tiled, it must divide by axis_size and shrinks by that factor.
  Array psum_scatter(const Array& x, const Axes& axes, int scatter_dim = 0, bool tiled = false);
  /// Sends x to the member at `dst` for each (src, dst) pair (axis indices); members nobody sends to get zeros.
  Array ppermute(const Array& x, const Axes& axes, const std::vector<std::pair<int, int>>& perm);
  /// Tiled: splits `split_dim` into axis_size chunks, chunk j to member j, and concatenates what arrives along
  /// `concat_dim`. Untiled: x.shape[split_dim] must equal axis_size; that dimension goes and a new one of size
  /// axis_size appears at `concat_dim` (JAX's rule).
  Array all_to_all(const Array& x, const Axes& axes, int split_dim, int concat_dim, bool tiled = false);
  /// Every member gets the block of the member at axis index `source`.
  Array pbroadcast(const Array& x, const Axes& axes, int source);

  /// Runs axis collective `what` on x (plan_axis's plan).
  Array run(AxisOp what, const Array& x, const Axes& axes, const AxisArgs& args = {});

  /// The token collectives of this context are ordered after (and that they advance).
  Token& token() noexcept { return token_; }

 private:

  Mesh mesh_;
  Token token_;
};

/// A shard_map body: this rank's blocks in, this rank's blocks out.
using ShardFn = std::function<std::vector<Array>(ShardContext&, std::span<const Array>)>;

/// Options of shard_map.
struct ShardMapOptions {
  /// Check at run time that outputs are equal along the mesh axes (of size > 1) their out_spec does not name: one
  /// allgather of a hash of each such output's values (-0.0 equals 0.0, NaNs equal NaNs); nothing at one rank or
  /// when no output promises replication. A broken promise raises InvalidArgument on every rank. Python spells it
  /// check_vma, JAX's current name (check_rep its alias).
  bool check_rep = true;
};

/// Runs `f` once per rank on its blocks, as JAX's shard_map: argument i is cut as NamedSharding(mesh, in_specs[i])
/// (resharded first if it is held otherwise); output j is assembled from the ranks' blocks as out_specs[j] says
/// (blocks concatenate along the named axes; an axis not named is a promise that the blocks are equal along it).
/// @throws InvalidArgument for the wrong number of in_specs or outputs, specs that do not fit, or (check_rep) a
///         broken replication promise.
std::vector<ShardedArray> shard_map(const ShardFn& f, const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                                    const std::vector<PartitionSpec>& out_specs, const std::vector<ShardedArray>& args,
                                    ShardMapOptions options = {});

}  // namespace shardkit
