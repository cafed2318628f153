#pragma once

// The NCCL launch fence: where two threads of one process launch NCCL operations on different communicators of one
// device, as XLA's thread (compiled programs, on the JAX layer's duplicate communicators) and the caller's thread
// (eager calls) do, the order of their launches is a race, and it can differ between ranks. NCCL kernels wait for
// their peers, and kernels of two communicators need not run side by side: two ranks that launched one
// communicator's operation before the other's in different orders may hang (NCCL's "Using multiple NCCL
// communicators concurrently"). The fence puts the launches in program order: before an operation on device buffers
// (NCCL, or its set-up), a thread outside a compiled program runs the process's fence, which the JAX layer makes wait
// for the compiled programs dispatched before (jax.effects_barrier).

#include <functional>

namespace shardkit {

/// Sets the process's fence (an empty function: none). The fence runs on the calling thread of eager operations that
/// take device buffers, before their NCCL launch; it may throw, and the operation then raises that.
void set_nccl_launch_fence(std::function<void()> fence);

/// While one lives, the calling thread runs a compiled program's operations (the XLA handlers): the fence is not run
/// there (it waits for those very programs).
class CompiledProgramScope {
 public:
  CompiledProgramScope();
  ~CompiledProgramScope();
  CompiledProgramScope(const CompiledProgramScope&) = delete;
  CompiledProgramScope& operator=(const CompiledProgramScope&) = delete;

 private:
  bool outer_;
};

namespace detail {
/// Runs the fence, unless the calling thread is in a compiled program or none is set.
void run_nccl_launch_fence();
}  // namespace detail

}  // namespace shardkit
