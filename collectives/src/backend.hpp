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

/// A communication engine over one group of ranks, made by its transport (transport.hpp), whose descriptor says which
/// operations it takes; run() is only called for those.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const noexcept = 0;
  /// Starts (or runs) the operation; the token completes with it.
  virtual Token run(const BackendCall& call, const OpContext& ctx) = 0;
  /// Stops every pending operation; called after a timeout. Never throws.
  virtual void abort() noexcept = 0;
  /// Facts about itself its transport's route rules read (TransportView::traits, in the transport's own terms).
  virtual std::uint32_t route_traits() const noexcept { return 0; }
};

/// Wraps a Waitable so that waiting it first runs `then` once (after completion), e.g. to copy staged data back.
Token then(Token token, std::function<void()> then);

}  // namespace shardkit::detail
