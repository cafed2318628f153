#pragma once

// Completion of nonblocking MPI operations: polling with a deadline, and the Waitable behind a pending token.

#include <mpi.h>

#include <functional>
#include <memory>
#include <vector>

#include "backend.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit::detail {

/// Waits for every request, polling so that a deadline or a signal (shardkit/core/interrupt.hpp) can end the wait.
/// Returns false on timeout or interrupt (requests left pending: raise_unfinished says which). Statuses are written
/// when `statuses` is non-empty (one per request).
bool wait_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>* statuses, Clock::time_point deadline);

/// Tests every request once (MPI_Testall; `statuses` holds one per request); true when all completed.
/// @throws BackendError with the error of the request that failed.
bool test_all(std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses);

/// Cancels and frees point-to-point receive requests left pending after a timeout. Never throws. (Collective and
/// send requests cannot be cancelled; they are left to the job's abort.)
void cancel_receives(std::vector<MPI_Request>& requests) noexcept;

/// The state of an issued nonblocking operation: its requests, the arrays they use (kept alive), and what to do
/// after completion (copy staged data back, fill a receive status).
struct PendingOp {
  std::vector<MPI_Request> requests;
  std::vector<Array> keep_alive;
  /// (staged host copy, device destination) pairs copied after completion.
  std::vector<std::pair<Array, Array>> copy_back;
  /// Runs last, with one status per request when want_statuses is set.
  std::function<void(const std::vector<MPI_Status>&)> on_complete;
  bool want_statuses = false;

  PendingOp() = default;
  PendingOp(PendingOp&&) = default;
  PendingOp& operator=(PendingOp&&) = default;
  /// Destroyed with requests still posted (an error between issuing and completing them), it keeps the arrays for
  /// good instead of freeing them: MPI may still read or write that memory.
  ~PendingOp();

  /// Runs the completion steps once the requests are done.
  void finish(const std::vector<MPI_Status>& statuses);
  /// Gives up on the posted requests (left to MPI, or to the job's end): their arrays are kept for good.
  void abandon() noexcept;
};

/// Keeps `arrays` alive until the process ends (reachable, so leak checkers do not report them): the memory of
/// operations left in flight.
void keep_forever(std::vector<Array> arrays);
/// The same for any memory a nonblocking MPI call left in flight may still read or write.
void keep_forever(std::shared_ptr<void> memory);

/// Waits for `requests` (wait_all under ctx's deadline); where the wait ends unfinished, keeps `buffers` (on the heap:
/// everything the requests read or write, which MPI may still use) for good and raises as raise_unfinished does. For
/// the set-up exchanges (agreements, the watchdog's addresses): their buffers must never live on the caller's stack.
void wait_or_raise(std::vector<MPI_Request>& requests, std::shared_ptr<void> buffers, const OpContext& ctx,
                   AbortState& abort, const std::string& detail);

/// Completes `op` now (blocking until done or the deadline) and runs its completion step.
/// @throws TimeoutError (after marking `abort` and cancelling) when the deadline passes, Interrupted on a signal.
void complete(PendingOp& op, const OpContext& ctx, AbortState& abort);

/// A pending token over `op`, completed (with the same deadline) when waited for.
Token pending_token(PendingOp op, const OpContext& ctx, std::shared_ptr<AbortState> abort);

/// Raises the error of an operation whose wait ended unfinished, after marking the communicator aborted and asking
/// that the job end at exit: Interrupted when a signal ended it (interrupt_signal()), TimeoutError otherwise.
[[noreturn]] void raise_unfinished(const OpContext& ctx, AbortState& abort, const std::string& detail);

}  // namespace shardkit::detail
