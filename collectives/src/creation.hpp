#pragma once

// Making communicators under the timeout and checked mode. A creation is collective: a rank that never arrives would
// leave the others blocked in MPI_Comm_dup or MPI_Comm_split for good. Duplicates use MPI_Comm_idup, polled against
// the deadline; splits (which MPI has no nonblocking form of) first agree, with a nonblocking exchange, that every
// rank has arrived, and only then call MPI_Comm_split. In checked mode the agreement is a signature exchange, which
// names the ranks that did not arrive and those that called something else.

#include <string>

#include "backend.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

/// Waits, under `options.timeout`, until every rank of `over` has arrived at the same creation step (`what`, described
/// as a step of communicator `name`). Collective over `over`, which must carry no other traffic with shardkit's
/// signature tags (a communicator shardkit owns). `seq` is the creation's sequence number on `over` (checked mode).
/// @throws TimeoutError (naming the missing ranks in checked mode; the job ends at exit), Interrupted (a signal
///         ended the wait), MismatchError.
void agree_to_create(MpiCommHandle over, const char* what, const std::string& name, std::uint64_t seq,
                     const CommOptions& options, AbortState& abort);

/// The same agreement as a step (`what`) of the operation `op` describes: its messages name that operation, its
/// deadline is the operation's. For set-ups an operation asks for on first use. `check`: a signature exchange.
void agree_within_operation(MpiCommHandle over, const OpContext& op, const char* what, bool check, AbortState& abort);

/// A number that every rank of `over` agrees on and that no other communicator of any of them has: the largest of the
/// pairs (a number its process had not given out, its world rank) the ranks offer, past which each then moves. The
/// flight recorder's dumps name communicators by it. Collective over `over` (a nonblocking reduction under
/// `options.timeout`, described as step `what` of communicator `name`). @throws TimeoutError naming the step, or
/// Interrupted.
std::int64_t agree_on_identity(MpiCommHandle over, const char* what, const std::string& name,
                               const CommOptions& options, AbortState& abort);

/// MPI_Comm_idup of `parent`, polled until `options.timeout` passes. Collective over `parent`.
/// @throws TimeoutError naming the step and communicator (the job ends at exit), or Interrupted.
MpiComm dup_within_timeout(MpiCommHandle parent, const char* what, const std::string& name, const CommOptions& options,
                           AbortState& abort);

}  // namespace shardkit::detail
