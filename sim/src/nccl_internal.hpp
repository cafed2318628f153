#pragma once

// What the simulated NCCL's two halves share: the communicator (nccl_comm.cpp makes, splits and ends it;
// nccl_ops.cpp enqueues its operations on the streams' workers) and its checks.

#include <mpi.h>
#include <nccl.h>

#include <atomic>
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
};

namespace shardkit::sim {

/// Records `what` for ncclGetLastError and returns `r`.
ncclResult_t nccl_error(ncclResult_t r, std::string what);
/// Fatal for a null communicator or one used after ncclCommAbort/ncclCommDestroy (real NCCL crashes or hangs).
void check_live(ncclComm_t c, const char* call);
/// Polls a non-blocking communicator reports ncclInProgress after each enqueueing call (SHARDKIT_SIM_NCCL_ENQUEUE_STALL=1:
/// for good, as when NCCL cannot finish enqueueing).
int enqueue_polls();

}  // namespace shardkit::sim
