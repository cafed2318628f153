#pragma once

// The internal interface every backend implements. The Communicator front end (communicator.cpp) validates
// arguments, runs checked mode, makes buffers contiguous and picks the backend; a backend only moves data.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/collectives/token.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

using Clock = std::chrono::steady_clock;

/// Names of operations, for signatures and messages.
enum class OpKind : std::uint32_t {
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
const char* op_name(OpKind op) noexcept;

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

  bool has_deadline() const noexcept { return deadline != Clock::time_point::max(); }
  /// "allreduce #12 on communicator 'world'".
  std::string describe() const;
};

/// Called when an operation timed out: marks the communicator aborted (shared with pending tokens).
struct AbortState {
  bool aborted = false;
  std::string reason;
};

/// A communication engine over one group of ranks. All arrays are contiguous and on a device the backend handles;
/// sizes have been validated. `send` and `recv` may be the same array (in-place operation).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const noexcept = 0;

  virtual Token allreduce(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) = 0;
  virtual Token reduce(const Array& send, Array& recv, ReduceOp op, int root, const OpContext& ctx) = 0;
  virtual Token bcast(Array& buf, int root, const OpContext& ctx) = 0;
  virtual Token allgather(const Array& send, Array& recv, const OpContext& ctx) = 0;
  virtual Token gather(const Array& send, Array& recv, int root, const OpContext& ctx) = 0;
  virtual Token scatter(const Array& send, Array& recv, int root, const OpContext& ctx) = 0;
  virtual Token reduce_scatter(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) = 0;
  virtual Token alltoall(const Array& send, Array& recv, const OpContext& ctx) = 0;
  virtual Token send(const Array& buf, int dest, int tag, const OpContext& ctx) = 0;
  virtual Token recv(Array& buf, int source, int tag, RecvStatus* status, const OpContext& ctx) = 0;
  virtual Token sendrecv(const Array& send, int dest, int send_tag, Array& recv, int source, int recv_tag,
                         RecvStatus* status, const OpContext& ctx) = 0;
  virtual Token barrier(const OpContext& ctx) = 0;
  virtual Token scan(const Array& send, Array& recv, ReduceOp op, const OpContext& ctx) = 0;
  /// counts and displacements in elements, one per rank.
  virtual Token allgatherv(const Array& send, Array& recv, std::span<const std::int64_t> counts,
                           std::span<const std::int64_t> displs, const OpContext& ctx) = 0;
  virtual Token alltoallv(const Array& send, std::span<const std::int64_t> send_counts,
                          std::span<const std::int64_t> send_displs, Array& recv,
                          std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs,
                          const OpContext& ctx) = 0;

  /// Stops every pending operation; called after a timeout. Never throws.
  virtual void abort() noexcept = 0;
};

/// The MPI backend over `comm` (borrowed: it must outlive the backend). `internal` gives the communicator the
/// backend uses for its own point-to-point traffic (large-count fallbacks), created on first use (collective).
std::unique_ptr<Backend> make_mpi_backend(MpiCommHandle comm, std::function<MpiCommHandle()> internal,
                                          std::shared_ptr<AbortState> abort_state);

/// True when this build has NCCL.
bool nccl_built() noexcept;
/// The NCCL backend over the ranks of `mpi_comm` on `device` (bootstrapped over `mpi_comm`). Collective.
std::unique_ptr<Backend> make_nccl_backend(MpiCommHandle mpi_comm, int device, std::shared_ptr<AbortState> abort_state);
/// An NCCL backend split from `parent` (ncclCommSplit). Collective over the parent; color < 0 gives nullptr.
std::unique_ptr<Backend> split_nccl_backend(Backend& parent, int color, int key,
                                            std::shared_ptr<AbortState> abort_state);

/// Wraps a Waitable so that waiting it first runs `then` once (after completion), e.g. to copy staged data back.
Token then(Token token, std::function<void()> then);

}  // namespace shardkit::detail
