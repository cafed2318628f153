#pragma once

// An NCCL communicator's lifetime, shared by the backend and the tokens of its operations: abort once, close within
// the communicator's timeout, and keep the memory of operations nobody waits for until NCCL is done with it.

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/waitable.hpp"

#define SHARDKIT_NCCL_CHECK(expr)                                                                          \
  do {                                                                                                     \
    const ncclResult_t shardkit_nccl_st_ = (expr);                                                         \
    if (shardkit_nccl_st_ != ncclSuccess && shardkit_nccl_st_ != ncclInProgress)                           \
      throw ::shardkit::BackendError(                                                                      \
          "NCCL", static_cast<int>(shardkit_nccl_st_),                                                     \
          ::shardkit::detail::concat("NCCL error ", static_cast<int>(shardkit_nccl_st_), " (",             \
                                     ncclGetErrorString(shardkit_nccl_st_), ": ", ncclGetLastError(nullptr), \
                                     ")", ::shardkit::detail::called_function(#expr)),                     \
          ::shardkit::detail::source_location(#expr, __FILE__, __LINE__));                                 \
  } while (0)

namespace shardkit::detail {

/// The NCCL communicator and its abort flag, shared with pending tokens so a timeout can abort it.
///
/// ncclCommAbort frees the communicator: it runs once (whoever gets there first: a token's timeout, an asynchronous
/// error, the communicator's abort(), closing), and after it nothing may touch the handle again (released()).
///
/// Closing (when the last backend or token lets go) is ncclCommFinalize, polled against the communicator's timeout,
/// then ncclCommDestroy: a plain ncclCommDestroy waits for every operation already issued, and one whose peers never
/// post it (a rank that left, or skipped it) would block that thread for good. Past the timeout the communicator is
/// aborted instead, with a warning, and the job is set to end through MPI_Abort (as after a timed-out operation).
struct NcclState {
  ncclComm_t comm = nullptr;
  int device = 0;
  std::chrono::milliseconds timeout{0};  ///< 0: closing waits as long as NCCL does
  std::shared_ptr<AbortState> abort;
  std::atomic<bool> handle_released{false};

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState();

  bool released() const noexcept { return handle_released.load(); }
  void abort_once(std::string reason) noexcept;
  /// Ends the wait of an operation that did not complete: aborts the communicator, asks that the job end at exit,
  /// and throws Interrupted when a signal ended the wait (interrupt_signal()), else TimeoutError (`detail` follows
  /// "did not complete within N s").
  [[noreturn]] void fail_wait(const OpContext& ctx, const std::string& detail);

  /// Takes over an operation whose tokens were all dropped before it completed: its event and the storage of its
  /// buffers, kept until the event has fired. Dropping them at once would free memory NCCL still reads or writes, or
  /// (cudaFree synchronises the device) block the dropping thread until the operation's peers take part.
  void adopt(cudaEvent_t event, std::vector<std::shared_ptr<void>> storage) noexcept;
  /// Releases what adopt() kept for operations that have completed. Called as each operation is issued.
  void reap() noexcept;

 private:
  struct Orphan {
    cudaEvent_t event;
    std::vector<std::shared_ptr<void>> storage;
  };
  void close() noexcept;

  std::mutex orphans_mu_;
  std::vector<Orphan> orphans_;
};

/// The token of one NCCL operation: a CUDA event recorded after it on the communicator's stream. Waiting polls the
/// event and the communicator's asynchronous error against the operation's deadline and for a signal, aborting when
/// either ends the wait. Holds the
/// storage of the operation's buffers until it completes (handed to NcclState::adopt if the token dies first).
class NcclEvent final : public Waitable {
 public:
  NcclEvent(cudaStream_t stream, std::shared_ptr<NcclState> state, const OpContext& ctx,
            std::initializer_list<Array> buffers);
  ~NcclEvent() override;
  NcclEvent(const NcclEvent&) = delete;
  NcclEvent& operator=(const NcclEvent&) = delete;

  void wait() override;
  bool is_complete() override { return done_ || poll(); }
  void enqueue_wait(StreamHandle stream) override;

 private:
  bool poll();

  cudaEvent_t event_ = nullptr;
  std::shared_ptr<NcclState> state_;
  OpContext ctx_;
  std::string name_;
  std::vector<std::shared_ptr<void>> keep_;
  bool done_ = false;
};

}  // namespace shardkit::detail
