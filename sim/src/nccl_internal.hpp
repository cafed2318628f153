#pragma once

// What the simulated NCCL's two halves share: the communicator (nccl_comm.cpp makes, splits and ends it;
// nccl_ops.cpp enqueues its operations on the streams' workers) and its checks.

#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

struct ncclComm {
  MPI_Comm data = MPI_COMM_NULL;  // operations (issued by stream workers)
  MPI_Comm ctrl = MPI_COMM_NULL;  // splits (issued by the calling thread)
  int rank = 0, size = 1, device = 0;
  std::atomic<bool> aborted{false};
  std::atomic<bool> dead{false};
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<int> pending{0};
  bool blocking = true;                 // created with ncclConfig_t::blocking != 0 (or no config)
  std::atomic<bool> finalized{false};  // ncclCommFinalize called: no more operations
  // Non-blocking communicators: after an enqueueing call (or a group's end) NCCL may still be enqueueing; it reports
  // ncclInProgress through ncclCommGetAsyncError for this many more polls, and the next call must wait until then.
  std::atomic<int> enqueue_polls{0};
  // The launch-order check (nccl_order.cpp): an id every member agrees on (from the unique id, or the parent's id and
  // split), the members' world ranks, and the splits made from this communicator so far.
  std::uint64_t uid = 0;
  std::vector<int> world;
  std::uint32_t splits = 0;
};

namespace shardkit::sim {

/// Records `what` for ncclGetLastError and returns `r`.
ncclResult_t nccl_error(ncclResult_t r, std::string what);
/// Fatal for a null communicator or one used after ncclCommAbort/ncclCommDestroy (real NCCL crashes or hangs).
void check_live(ncclComm_t c, const char* call);
/// Polls a non-blocking communicator reports ncclInProgress after each enqueueing call (SHARDKIT_SIM_NCCL_ENQUEUE_STALL=1:
/// for good, as when NCCL cannot finish enqueueing).
int enqueue_polls();
/// Waits for MPI requests on a worker; gives up (false) when the communicator is aborted, as an aborted NCCL kernel does.
bool wait_all(ncclComm_t c, std::vector<MPI_Request>& reqs);

// ---- launch order across the communicators of one device (nccl_order.cpp) ----------------------------------------
/// What this rank had launched on the other communicators of its device when it launched an operation.
using LaunchSnapshot = std::vector<std::int64_t>;
/// A made communicator of two ranks or more joins its device's table; it leaves when destroyed or aborted.
void order_join(ncclComm_t c);
void order_leave(ncclComm_t c);
/// Taken when an operation is launched (before order_count counts it).
LaunchSnapshot order_snapshot(ncclComm_t c);
/// Counts a launch on `c`: a collective (peer -1), or a send or receive with the communicator's rank `peer`.
void order_count(ncclComm_t c, int peer = -1, bool send = false);
/// On the worker, before a collective: every member's snapshot; fatal where two ranks launched the communicators they
/// share in different orders. False when the communicator was aborted meanwhile.
bool order_check_all(ncclComm_t c, const char* call, const LaunchSnapshot& mine);
/// Point-to-point: the sender's snapshot travels ahead of its data (keep `mine` alive until `req` completes), and the
/// receiver compares it with its own.
void order_send(ncclComm_t c, int peer, const LaunchSnapshot& mine, MPI_Request* req);
bool order_check_from(ncclComm_t c, const char* call, int peer, const LaunchSnapshot& mine);

}  // namespace shardkit::sim
