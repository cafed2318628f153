#pragma once

// The axis collectives of a shard_map body (psum, all_gather, ppermute, ...), planned once: which operation of the
// table runs, on what shape, with which reduction, root or partner, and how the block's shape moves around it. The
// eager body (ShardContext, C++) and the traced body (shardkit.jax._collectives, Python on JAX tracers) both execute
// these plans, so their shape rules, checks and messages are one.

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkit/collectives/ops.hpp"
#include "shardkit/sharding/mesh.hpp"

namespace shardkit {

/// How an axis reduction (psum, pmax, pmin) runs on a dtype, with JAX's rules: bool sums as int32 (a count, int32
/// result), bool max and min are logical or and and (bool results); other dtypes as given, where the operation table
/// defines the reduction.
struct AxisReduction {
  ReduceOp op;  ///< the reduction the allreduce runs
  DType input;  ///< the dtype the value is converted to first (its own when no conversion is needed)
};
/// @param name  "psum", "pmax" or "pmin", for the error
/// @throws InvalidArgument when the reduction is not defined for `dtype` (before anything is sent or traced).
AxisReduction axis_reduction(ReduceOp op, DType dtype, const char* name);

/// The axis collectives, under their JAX names.
enum class AxisOp : std::uint8_t {
  kPsum,
  kPmean,
  kPmax,
  kPmin,
  kAllGather,
  kPsumScatter,
  kPpermute,
  kAllToAll,
  kPbroadcast
};
inline constexpr int kAxisOpCount = static_cast<int>(AxisOp::kPbroadcast) + 1;
/// "psum", "all_gather", ...
const char* axis_op_name(AxisOp op) noexcept;
/// @throws InvalidArgument for a name that is not an axis collective.
AxisOp axis_op_from_name(std::string_view name);

/// The arguments of an axis collective besides the value and the axes (each reads its own).
struct AxisArgs {
  int dim = 0;                            ///< all_gather: axis; psum_scatter: scatter_dimension; all_to_all: split_axis
  int concat_dim = 0;                     ///< all_to_all: concat_axis
  bool tiled = false;                     ///< all_gather, psum_scatter, all_to_all
  int source = 0;                         ///< pbroadcast: the axis index whose block everyone gets
  std::vector<std::pair<int, int>> perm;  ///< ppermute: (source, destination) pairs of axis indices
};

/// One move of a block's shape: a dimension moved as numpy.moveaxis(x, from, to) (from >= 0), or a reshape to
/// `shape` (from < 0).
struct ShapeMove {
  int from = -1;
  int to = -1;
  Shape shape;
};

/// The tag of a ppermute's messages (eager and traced alike).
inline constexpr int kPpermuteTag = 7;

/// What one rank runs for one axis collective. The block x is converted to `input`, moved by `before`, handed to the
/// table operation `op` (value form, over the axes' communicator, with `reduce`, `root`, `dest`, `source` and `tag`),
/// and its value is moved by `after`, converted to `output` and divided by `divide`. `zeros`: the value is zeros
/// shaped like x instead (a ppermute member nobody sends to; `op` may still send).
struct AxisPlan {
  AxisOp what = AxisOp::kPsum;
  std::optional<OpKind> op;  ///< none: nothing to send or receive (a ppermute member outside the permutation)
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  int dest = -1;    ///< ppermute: the axis index this rank sends to (-1: none)
  int source = -1;  ///< ppermute: the axis index this rank receives from (-1: none)
  int tag = kPpermuteTag;
  /// ppermute: what the other members run (kAllSendrecv: the permutation moves every axis index; kMixed otherwise),
  /// which decides whether the exchange may take shm on a communicator that wraps the caller's (OpArgs::peers)
  Peers peers = Peers::kUnknown;
  DType input = DType::kFloat32;
  DType output = DType::kFloat32;
  std::vector<ShapeMove> before;
  std::vector<ShapeMove> after;
  std::int64_t divide = 1;
  bool zeros = false;
  Shape shape;  ///< the result's shape
};

/// The exchange of a ppermute member that sends to `dest` and receives from `source` (-1: not): sendrecv, send,
/// recv, or none. One rule for the eager body and the traced one (whose transpose swaps dest and source).
std::optional<OpKind> exchange_op(int dest, int source) noexcept;

/// Plans axis collective `what` of a block of `shape` and `dtype` over `axes` of `mesh`, for this rank.
/// @throws InvalidArgument for a dimension out of range, a dimension that does not split over the axes, a
///         permutation that is not one, a source out of range, or a reduction the dtype does not have; every rank
///         raises alike, before anything is sent or traced.
AxisPlan plan_axis(AxisOp what, const Mesh& mesh, const Axes& axes, const Shape& shape, DType dtype,
                   const AxisArgs& args = {});

}  // namespace shardkit
