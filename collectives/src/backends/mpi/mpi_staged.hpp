#pragma once

// What every operation of the MPI backend is built from (class MpiStaged): its communicator and per-call count limit,
// the memory a call uses for each array (its own, or a pinned host copy of GPU memory an MPI library cannot read), and
// finishing a call (blocking; polled to completion against the deadline; or, async, a pending token). Its collectives
// (mpi_backend.cpp) and point-to-point operations (mpi_p2p.hpp) derive from it.

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend.hpp"
#include "backends/mpi/mpi_call.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "backends/mpi/staging.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {

class MpiStaged {
 public:
  MpiStaged(MpiCommHandle comm, std::function<MpiCommHandle()> internal, std::shared_ptr<AbortState> abort,
            std::int64_t max_count)
      : c_(to_mpi<MPI_Comm>(comm)),
        internal_(std::move(internal)),
        abort_(std::move(abort)),
        max_count_(max_count),
        cuda_aware_(mpi_cuda_aware()) {
    SHARDKIT_CHECK(max_count >= 1 && max_count <= INT_MAX, "max_message_elements must be in [1, INT_MAX], got ",
                   max_count);
    SHARDKIT_MPI_CHECK(MPI_Comm_rank(c_, &rank_));
    SHARDKIT_MPI_CHECK(MPI_Comm_size(c_, &size_));
  }

 protected:
  static bool nonblocking(const OpContext& ctx) { return ctx.async || ctx.has_deadline(); }

  // Takes the operation by reference (moved from only when a pending token takes it): a blocking operation, the
  // common case, builds and destroys one PendingOp.
  Token finish(PendingOp&& p, const OpContext& ctx) {
    if (p.requests.empty()) {
      if (!p.copy_back.empty() || p.on_complete) p.finish({});  // blocking: done, only staged copies may remain
      return Token();
    }
    if (ctx.async) return pending_token(std::move(p), ctx, abort_);
    complete(p, ctx, *abort_);
    return Token();
  }

  // GPU memory for a library that cannot read it: a pinned host copy (filled now for inputs).
  bool needs_staging(const Array& a) const { return a.device().kind == DeviceKind::kCUDA && !cuda_aware_; }

  // True when an operation can be one blocking MPI call on the buffers themselves: no timeout and not async, one
  // chunk, and memory MPI reads (no staging); the buffers' ready events are then waited for. The per-call hot path
  // of small reductions (psum, mpi4jax's allreduce): no pending-operation state to build.
  bool direct(const OpContext& ctx, std::int64_t count, const Array& a, const Array& b) const {
    if (nonblocking(ctx) || count > max_count_ || needs_staging(a) || needs_staging(b)) return false;
    a.wait_ready();
    b.wait_ready();
    return true;
  }

  // The memory an operation uses for `a`: its own (kept alive by the pending operation when nonblocking), or, for GPU
  // memory MPI cannot read, a pinned host copy: filled now for inputs, copied back after completion for outputs.
  // The first case, every host buffer's, stays inline: it is the per-call cost of every small operation.
  enum class Use { kIn, kOut, kInOut };
  [[gnu::always_inline]] Buf stage(const Array& a, PendingOp& p, bool nb, Use use) {
    a.wait_ready();
    if (needs_staging(a)) [[unlikely]]
      return stage_pinned(a, p, use);
    if (nb) p.keep_alive.push_back(a);
    return {static_cast<char*>(a.data()), static_cast<std::int64_t>(a.itemsize())};
  }
  [[gnu::noinline]] Buf stage_pinned(const Array& a, PendingOp& p, Use use) {
    Array host = pinned_like(a);
    if (use != Use::kOut) host.copy_from(a);
    if (use == Use::kIn)
      p.keep_alive.push_back(host);
    else
      p.copy_back.emplace_back(host, a);
    return {static_cast<char*>(host.data()), static_cast<std::int64_t>(host.itemsize())};
  }

  MPI_Comm c_;
  std::function<MpiCommHandle()> internal_;
  std::shared_ptr<AbortState> abort_;
  std::int64_t max_count_;
  int rank_ = 0, size_ = 1;
  bool cuda_aware_;
};

}  // namespace shardkit::detail
