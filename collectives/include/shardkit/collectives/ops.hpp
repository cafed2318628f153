#pragma once

// The operations a Communicator runs, described once. Every operation is an OpKind plus an OpArgs; its entry in the
// operation table (collectives/src/op_table.cpp) says which arrays it reads and writes, how its arguments are
// validated, what checked mode compares, the shape of its value-form result, and which backends implement it. The
// Communicator's typed methods, the Python bindings and the JAX handlers are views of that one description.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "shardkit/core/array.hpp"

namespace shardkit {

/// Reductions. Sum, prod, min and max apply to every numeric dtype (min/max not to complex); the logical and bitwise
/// ones to integers and bool. Backends may implement a subset (NCCL: see docs/cpp.md).
enum class ReduceOp { kSum, kProd, kMin, kMax, kLogicalAnd, kLogicalOr, kLogicalXor, kBitAnd, kBitOr, kBitXor };
/// How many reductions there are: ReduceOp's values are 0 .. kReduceOpCount - 1.
inline constexpr int kReduceOpCount = static_cast<int>(ReduceOp::kBitXor) + 1;
/// "sum", "prod", ..., "bxor": the reduction's name in shardkit's one table of names, which every view reads (Python's
/// names, mpi4py's operations and the ReduceOp members are these in upper case).
const char* reduce_op_name(ReduceOp op) noexcept;
/// The reduction named `name`, in any case ("sum", "SUM", "Sum").
/// @throws InvalidArgument "unknown reduction 'name' (sum, prod, ...)" when no reduction has that name.
ReduceOp reduce_op_from_name(std::string_view name);
/// Every reduction's name, in ReduceOp order, joined with ", " ("sum, prod, ..., bxor"; "SUM, PROD, ..." when
/// `upper_case`): the list an error message offers.
std::string reduce_op_names(bool upper_case = false);
/// True when `op` is defined for `dtype` (the MPI backend implements every defined pair).
bool reduce_op_supports(ReduceOp op, DType dtype) noexcept;

/// Wildcards for recv / sendrecv.
inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;

/// Every operation, in table order.
enum class OpKind : std::uint8_t {
  kAllreduce,
  kReduce,
  kBcast,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kSend,
  kRecv,
  kSendrecv,
  kBarrier,
  kScan,
  kAllgatherv,
  kAlltoallv,
};
inline constexpr int kOpCount = static_cast<int>(OpKind::kAlltoallv) + 1;

/// "allreduce", "reduce_scatter", ...
const char* op_name(OpKind op) noexcept;
/// The operation named `name`. @throws InvalidArgument for a name that is none.
OpKind op_from_name(std::string_view name);

/// What a receive matched.
struct RecvStatus {
  int source = -1;
  int tag = -1;
  std::int64_t count = 0;  ///< elements received
};

/// sendrecv: what the peers run at the same time. On a communicator made with shm (world, from_mpi, split, dup on one
/// node) every point-to-point operation takes shm whatever this says; on one that wraps the caller's (shm made by its
/// first collective), point-to-point operations take MPI, and this decides whether a sendrecv may take shm all the
/// same (docs/shm.md).
enum class Peers : std::uint8_t {
  kUnknown,       ///< a program's own sendrecv, which may be answered with a send or recv: there, shm only where forced
  kAllSendrecv,   ///< every rank of the communicator runs a sendrecv now (a ppermute of every axis index): routed as
                  ///< a collective, shm by default
  kMixed,         ///< some peers send or receive alone, or sit out (any other ppermute): there, always MPI
};

/// The arguments of any operation; each operation reads the fields its table entry names and ignores the others.
/// `send` and `recv` may be the same array (in place). Arrays may be strided: they are made contiguous for the
/// backend and copied back.
struct OpArgs {
  const Array* send = nullptr;
  Array* recv = nullptr;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  int dest = 0;                  ///< send, sendrecv
  int source = kAnySource;       ///< recv, sendrecv
  int send_tag = 0;              ///< send, sendrecv
  int recv_tag = kAnyTag;        ///< recv, sendrecv
  RecvStatus* status = nullptr;  ///< recv, sendrecv: filled when the receive completes
  std::span<const std::int64_t> send_counts;  ///< alltoallv: elements to each rank
  std::span<const std::int64_t> recv_counts;  ///< allgatherv: every rank's count; alltoallv: elements from each rank
  /// alltoallv: where rank j's elements start in `send` (empty: packed in rank order). The regions may overlap (the
  /// same elements sent to several ranks).
  std::span<const std::int64_t> send_displs;
  Peers peers = Peers::kUnknown;  ///< sendrecv: what the peers run (shm's pairing)
};

/// How the value form of an operation makes its result from its input `x` (mpi4jax's per-rank shape rules).
enum class ValueRule : std::uint8_t {
  kNone,         ///< no value form (send, barrier, alltoallv): the buffer form only
  kSameShape,    ///< a new array shaped like x; x is the send buffer (allreduce, scan, alltoall)
  kStacked,      ///< shape (size, *x.shape); x is the send buffer (allgather)
  kRootStacked,  ///< on the root as kStacked, elsewhere x itself (gather)
  kRootSame,     ///< on the root as kSameShape, elsewhere x itself (reduce)
  kDropLeading,  ///< x has shape (size, *s); a new array of shape s (reduce_scatter)
  kScatter,      ///< on the root as kDropLeading; elsewhere x gives shape s and is not read (scatter)
  kRootCopy,     ///< a new array shaped like x, holding x on the root, the root's x after (bcast)
  kLike,         ///< a new array shaped like x, which only gives shape and dtype (recv, sendrecv)
  kConcat,       ///< the ranks' x flattened and concatenated (allgatherv)
};

/// The value-form facts of an operation, for views that allocate results themselves (the NumPy fast path).
ValueRule value_rule(OpKind op) noexcept;
/// "same_shape", "stacked", ...: the rule's name, for the Python and JAX layers.
const char* value_rule_name(ValueRule rule) noexcept;
/// True when the value form on `rank` reads x's leading axis as one block per rank, so x.shape[0] must equal the size
/// (reduce_scatter, alltoall, scatter on the root). The JAX layer batches such an x behind that axis.
bool value_splits_leading(OpKind op, int rank, int root) noexcept;
/// True when the value form's result on `rank` has a new leading axis of one entry per rank (allgather, gather on the
/// root).
bool value_stacks(OpKind op, int rank, int root) noexcept;

/// What an operation takes besides its buffers (the operation table's flags).
struct OpTraits {
  bool collective;  ///< every rank of the communicator calls it (point-to-point operations do not)
  bool reduces;     ///< takes a reduction
  bool rooted;      ///< takes a root
  bool has_dest;    ///< takes a destination and a send tag
  bool has_source;  ///< takes a source and a receive tag
};
OpTraits op_traits(OpKind op) noexcept;
/// The shape of the value-form result for input `x` on `rank` of `size` ranks (the input itself for the rules that
/// return it). Not defined for kNone and kConcat (whose shape needs every rank's count).
/// @throws InvalidArgument when x's shape breaks the rule (for example x.shape[0] != size for kDropLeading).
Shape value_shape(OpKind op, const Shape& x, int rank, int size, int root);
/// True when the value form returns the input itself on this rank (kRootSame / kRootStacked off the root).
bool value_is_input(OpKind op, int rank, int root) noexcept;
/// Points `args.send` / `args.recv` at the value form's input `x` and its result `out` (allocated with value_shape's
/// shape) as the rule says, and fills `out` with x on the root for kRootCopy. When value_is_input(), `out` is unused.
void bind_value(OpKind op, const Array& x, Array& out, OpArgs& args, int rank);

}  // namespace shardkit
