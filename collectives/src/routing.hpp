#pragma once

// Backend choice for one operation, from the backends' declarations (mpi_supports, nccl_supports), the configured
// backend and where the operation's buffers live. A pure function, so every operation × setting × placement can be
// tested without a GPU.

#include "shardkit/collectives/communicator.hpp"

namespace shardkit::detail {

/// Where the arrays an operation uses on this rank live.
enum class Placement {
  kNone,    ///< no arrays (barrier)
  kHost,    ///< all in host memory
  kDevice,  ///< all in GPU memory (device or managed), whatever their size
  kMixed,   ///< some of each
};

struct RouteRequest {
  OpKind op;
  BackendKind setting;  ///< CommOptions::backend
  Placement placement;
  DType dtype = DType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  /// Whether the ranks agreed on an NCCL communicator (asked only when the answer matters: see needs_nccl()).
  bool nccl_available = false;
  /// Bytes of the operation's first array on this rank, a scatter's receive buffer (the same on every rank for the
  /// operations shm implements).
  std::int64_t bytes = 0;
  /// Whether the communicator has a shm backend (asked only when the answer matters: see needs_shm()).
  bool shm_available = false;
  /// Whether that backend is hierarchical (its ranks span nodes: shm/hierarchy.hpp), which implements fewer operations
  /// (hier_supports) and has a table of its own (hier_by_default). Known once the first collective routed to shm has
  /// made the backend; false until then.
  bool shm_hierarchical = false;
  /// Whether that backend's ranks outnumber their CPUs (Backend::crowded), which its table reads. Known once the
  /// backend is made; false until then.
  bool shm_crowded = false;
  /// Whether the communicator's shm backend carries every point-to-point operation (send, recv, sendrecv, with MPI's
  /// matching: shm/shm_p2p.hpp). Decided when the communicator was made, by every rank alike (a send before the
  /// decision and its receive after it would take different backends): CommunicatorImpl::p2p_shm.
  bool p2p_shm = false;
  /// Where it does not, a sendrecv may still take shm where all the ranks run one at once (a collective, then) and the
  /// communicator has shm: both peers named (no wildcard source), and both this rank or neither.
  bool named_peers = true;
  /// And what the peers run (OpArgs::peers): kAllSendrecv takes the table's sendrecv row; kUnknown takes shm only where
  /// forced; kMixed never.
  Peers peers = Peers::kUnknown;
};

/// True when `r` would take the shm backend if the communicator has one: host buffers (or none), an operation shm
/// implements, and either SHARDKIT_BACKEND=shm or the default route (shm_by_default, or hier_by_default for a
/// hierarchical backend) on auto.
bool needs_shm(const RouteRequest& r) noexcept;
/// Before the communicator's shm backend is made (flat or hierarchical is not known yet): whether either would take `r`.
bool may_need_shm(RouteRequest r) noexcept;
/// The default route's table: where shm was measured faster than MPI (see docs/shm.md), for ranks that
/// outnumber their CPUs (`crowded`) or not.
bool shm_by_default(OpKind op, std::int64_t bytes, bool crowded = false) noexcept;
/// The default route's table for a communicator spanning nodes: where the hierarchical path was measured faster than
/// flat MPI (see docs/shm.md).
bool hier_by_default(OpKind op, std::int64_t bytes) noexcept;

/// True when route() depends on whether NCCL is available (the caller then sets it up, collectively, first).
bool needs_nccl(const RouteRequest& r) noexcept;

/// The backend that runs `r`: shm when needs_shm() and the communicator has it; NCCL for GPU buffers when NCCL is available and declares the operation (always, for a
/// setting of nccl), MPI otherwise, including operations NCCL does not implement (they fall back to MPI, staging GPU
/// buffers through host memory).
/// @throws InvalidArgument naming the operation and backend when SHARDKIT_BACKEND=nccl meets host buffers.
BackendKind route(const RouteRequest& r);

}  // namespace shardkit::detail
