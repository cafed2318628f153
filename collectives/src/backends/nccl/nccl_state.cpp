#include "nccl_state.hpp"

#include <cstdio>
#include <thread>

#include "flight_recorder.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/interrupt.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

void NcclState::fail_wait(const OpContext& ctx, const std::string& detail) {
  fail_current_operation();  // before the dump below: it records the operation as failed
  const std::string consequence = "the NCCL communicator was aborted and the job will end at exit";
  if (interrupt_signal() != 0) {
    abort_once(ctx.describe() + " was interrupted by a signal");
    end_job_at_exit(abort->reason);
    throw_interrupted(ctx.describe(), consequence);
  }
  const std::string why = concat(ctx.describe(), " did not complete within ", ctx.timeout.count() / 1000.0, " s", detail);
  abort_once(why);
  end_job_at_exit(abort->reason);
  throw TimeoutError(concat(why, "; ", consequence));
}

void NcclState::abort_once(std::string reason) noexcept {
  if (handle_released.exchange(true)) return;
  abort->aborted = true;
  if (abort->reason.empty()) abort->reason = std::move(reason);
  ncclCommAbort(comm);
}

void NcclState::close() noexcept {
  // The MPI side may have aborted the communicator: then release it without waiting on a broken peer.
  if (abort->aborted) {
    abort_once("aborted");
    return;
  }
  const Clock::time_point deadline = deadline_after(timeout);
  ncclResult_t r = ncclCommFinalize(comm);
  for (long spin = 0; r == ncclInProgress; ++spin) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
    if (r != ncclInProgress) break;
    if (Clock::now() >= deadline) {
      const std::string why = concat("an NCCL operation was still pending after ", timeout.count() / 1000.0,
                                     " s when its communicator was destroyed (a rank did not take part)");
      std::fprintf(stderr, "shardkit: warning: %s; the NCCL communicator was aborted\n", why.c_str());
      abort_once(why);
      end_job_at_exit(why);
      return;
    }
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (r != ncclSuccess) {
    std::fprintf(stderr, "shardkit: warning: closing the NCCL communicator failed (%s); it was aborted\n",
                 ncclGetErrorString(r));
    abort_once("closing failed");
    return;
  }
  handle_released = true;
  if (ncclCommDestroy(comm) != ncclSuccess) std::fprintf(stderr, "shardkit: warning: ncclCommDestroy failed\n");
}

NcclState::~NcclState() {
  try {
    cuda::DeviceGuard guard(device);
    if (comm && !released()) close();
    // Every operation has completed or was aborted: what the orphans kept can go.
    for (Orphan& o : orphans_) cudaEventDestroy(o.event);
    orphans_.clear();
  } catch (...) {
    std::fprintf(stderr, "shardkit: warning: releasing an NCCL communicator failed\n");
  }
}

void NcclState::adopt(cudaEvent_t event, std::vector<std::shared_ptr<void>> storage) noexcept {
  try {
    std::lock_guard lock(orphans_mu_);
    orphans_.push_back({event, std::move(storage)});
  } catch (...) {
    // Out of memory: keep the storage for good rather than free memory NCCL may still use.
    new std::vector<std::shared_ptr<void>>(std::move(storage));
  }
}

void NcclState::reap() noexcept {
  std::vector<Orphan> done;
  {
    std::lock_guard lock(orphans_mu_);
    if (orphans_.empty()) return;
    for (std::size_t i = 0; i < orphans_.size();) {
      if (cudaEventQuery(orphans_[i].event) == cudaSuccess) {
        done.push_back(std::move(orphans_[i]));
        orphans_[i] = std::move(orphans_.back());
        orphans_.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (Orphan& o : done) cudaEventDestroy(o.event);  // the storage goes with `done`, outside the lock
}

NcclEvent::NcclEvent(cudaStream_t stream, std::shared_ptr<NcclState> state, const OpContext& ctx,
                     std::initializer_list<Array> buffers)
    : state_(std::move(state)), ctx_(ctx), name_(*ctx.comm_name) {
  ctx_.comm_name = &name_;
  ctx_.after = nullptr;
  // The storage only: the Arrays' ready events would chain every earlier operation on the same buffers to this one.
  keep_.reserve(buffers.size());
  for (const Array& a : buffers)
    if (a.storage()) keep_.push_back(a.storage());
  cuda::DeviceGuard guard(state_->device);
  SHARDKIT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  SHARDKIT_CUDA_CHECK(cudaEventRecord(event_, stream));
}

NcclEvent::~NcclEvent() {
  if (!event_) return;
  if (!done_ && !state_->released()) {
    state_->adopt(event_, std::move(keep_));
    return;
  }
  cudaEventDestroy(event_);
}

void NcclEvent::wait() {
  if (done_ || poll()) return;
  const InterruptibleWait waiting;
  for (long spin = 0;; ++spin) {
    if (poll()) return;
    if (interrupt_signal() != 0 || (ctx_.has_deadline() && Clock::now() >= ctx_.deadline)) state_->fail_wait(ctx_, "");
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclEvent::enqueue_wait(StreamHandle stream) {
  if (done_) return;
  if (state_->released())  // the event will never fire: a device-side wait would stall `stream` for good
    throw BackendError("NCCL", static_cast<int>(ncclInvalidUsage),
                       concat(ctx_.describe(), " will not complete: its NCCL communicator was aborted"));
  SHARDKIT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

bool NcclEvent::poll() {
  if (state_->released())
    throw BackendError("NCCL", static_cast<int>(ncclInvalidUsage),
                       concat(ctx_.describe(), " will not complete: its NCCL communicator was aborted (",
                              state_->abort->reason, ")"));
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaSuccess) {
    done_ = true;
    keep_.clear();
    return true;
  }
  if (e != cudaErrorNotReady) SHARDKIT_CUDA_CHECK(e);
  ncclResult_t async = ncclSuccess;
  SHARDKIT_NCCL_CHECK(ncclCommGetAsyncError(state_->comm, &async));
  if (async != ncclSuccess && async != ncclInProgress) {
    state_->abort_once(concat(ctx_.describe(), " failed asynchronously"));
    throw BackendError("NCCL", static_cast<int>(async),
                       concat(ctx_.describe(), " failed asynchronously: ", ncclGetErrorString(async)));
  }
  return false;
}

}  // namespace shardkit::detail
