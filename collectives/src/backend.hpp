#pragma once

// The internal interface every backend implements. The Communicator front end (communicator.cpp) validates
// arguments, runs checked mode, makes buffers contiguous and picks the backend; a backend only moves data.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/collectives/token.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

using Clock = std::chrono::steady_clock;

/// `timeout` from now, or Clock::time_point::max() for no timeout (a timeout of 0).
Clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept;

/// What a backend needs to know about the operation it runs, beyond its buffers.
struct OpContext {
  OpKind op;
  std::uint64_t seq;             ///< sequence number on the communicator (collectives)
  const std::string* comm_name;  ///< for messages
  /// Must complete before the operation starts.
  const Token* after;
  /// When the operation must have completed (Clock::time_point::max(): no timeout).
  Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  /// Return a pending token instead of completing before returning (MPI).
  bool async;
  /// Describes a step that is not an operation of the table (making a communicator); nullptr for operations.
  const char* step = nullptr;

  /// A step that is not an operation of the table (`what`: "the NCCL decision") on communicator `name` (which must
  /// outlive the context), as `op` for checked mode's messages, its deadline `timeout` from now.
  static OpContext for_step(OpKind op, const char* what, const std::string& name, std::chrono::milliseconds timeout,
                            std::uint64_t seq = 0);

  bool has_deadline() const noexcept { return deadline != Clock::time_point::max(); }
  /// "allreduce #12 on communicator 'world'", or "<step> of communicator 'world'".
  std::string describe() const;
};

struct WaitPolicy;  // shm/shm_segment.hpp

/// Called when an operation timed out: marks the communicator aborted (shared with pending tokens).
struct AbortState {
  bool aborted = false;
  std::string reason;
};

/// An operation as a backend runs it: arrays contiguous and on a device the backend handles, sizes validated.
struct BackendCall {
  OpKind op;
  /// The array read on this rank (nullptr when the operation reads none here).
  const Array* send = nullptr;
  /// The array written on this rank (nullptr when none); the same object as `send` for an operation in place.
  Array* recv = nullptr;
  /// Scalars and counts (reduce, root, peers, tags, status, counts).
  const OpArgs* args = nullptr;
  /// Element displacements for the v-operations, one per rank.
  std::span<const std::int64_t> send_displs;
  std::span<const std::int64_t> recv_displs;

  bool in_place() const noexcept { return send != nullptr && static_cast<const Array*>(recv) == send; }
};

/// A communication engine over one group of ranks. Which operations it implements it declares in a function the
/// router reads (mpi_supports, nccl_supports below); run() is only called for those.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const noexcept = 0;
  /// Starts (or runs) the operation; the token completes with it.
  virtual Token run(const BackendCall& call, const OpContext& ctx) = 0;
  /// Stops every pending operation; called after a timeout. Never throws.
  virtual void abort() noexcept = 0;
  /// Whether its ranks outnumber their CPUs, so that its waits give the CPU up at once (shm: WaitPolicy).
  virtual bool crowded() const noexcept { return false; }
};

/// What the MPI backend implements: every operation on every dtype and defined reduction (host memory, or device
/// memory staged through pinned buffers).
bool mpi_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;
/// What the NCCL backend implements (declared in every build, NCCL or not): no scan or barrier; the reductions its
/// table gives an NCCL form (nccl_caps.hpp: complex as pairs of reals for sum only; bool for logical/bitwise and/or
/// only; float32/float64 max/min over order keys, in allreduce only); data movement on every dtype.
bool nccl_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;

/// What the shm backend implements (shm/shm_backend.cpp): allreduce, reduce, reduce_scatter (every defined reduction),
/// bcast, allgather, alltoall, barrier and sendrecv, on host buffers.
bool shm_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;
/// The shm backend over the ranks of `comm` when they are all on one node and a shared segment could be made and
/// mapped by every rank; else nullptr on every rank, with the reason in `why`. Collective, with blocking MPI calls on
/// `comm`: every rank must be known to have arrived (agree_to_create) first. `rank_names`: the number its messages
/// give each rank of `comm` (empty: its rank in `comm`), e.g. its rank in a communicator `comm` is a node's part of.
/// `policy`: how its ranks wait (nullptr: WaitPolicy::for_comm; tests give one, e.g. a CPU per rank where the machine
/// has fewer).
std::unique_ptr<Backend> make_shm_backend(MpiCommHandle comm, std::shared_ptr<AbortState> abort_state,
                                          std::string* why, std::vector<int> rank_names = {},
                                          const WaitPolicy* policy = nullptr);

/// The MPI backend over `comm` (borrowed: it must outlive the backend). `internal` gives the communicator the
/// backend uses for its own point-to-point traffic (large-count fallbacks), created on first use (collective).
/// `max_count` is the largest element count of one MPI call (CommOptions::max_message_elements).
std::unique_ptr<Backend> make_mpi_backend(MpiCommHandle comm, std::function<MpiCommHandle()> internal,
                                          std::shared_ptr<AbortState> abort_state, std::int64_t max_count);

/// True when this build has NCCL.
bool nccl_built() noexcept;
/// The NCCL backend over the ranks of `mpi_comm` on `device` (bootstrapped over `mpi_comm`). Collective. Creation
/// is non-blocking and polled: past `timeout` (0: none) the communicator is aborted and TimeoutError thrown.
std::unique_ptr<Backend> make_nccl_backend(MpiCommHandle mpi_comm, int device, std::shared_ptr<AbortState> abort_state,
                                           std::chrono::milliseconds timeout);
/// An NCCL backend split from `parent` (ncclCommSplit). Collective over the parent; color < 0 gives nullptr.
/// Same deadline rule as make_nccl_backend.
std::unique_ptr<Backend> split_nccl_backend(Backend& parent, int color, int key,
                                            std::shared_ptr<AbortState> abort_state, std::chrono::milliseconds timeout);

/// Wraps a Waitable so that waiting it first runs `then` once (after completion), e.g. to copy staged data back.
Token then(Token token, std::function<void()> then);

}  // namespace shardkit::detail
