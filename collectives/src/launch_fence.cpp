// The NCCL launch fence (launch_fence.hpp): one function for the process, and a per-thread mark for compiled programs.

#include "shardkit/collectives/launch_fence.hpp"

#include <memory>
#include <mutex>

namespace shardkit {
namespace {

std::mutex mu;
std::shared_ptr<const std::function<void()>> fence;  // swapped whole: a running fence is not destroyed under it
thread_local bool in_compiled = false;

}  // namespace

void set_nccl_launch_fence(std::function<void()> f) {
  std::lock_guard lock(mu);
  fence = f ? std::make_shared<const std::function<void()>>(std::move(f)) : nullptr;
}

CompiledProgramScope::CompiledProgramScope() : outer_(in_compiled) { in_compiled = true; }
CompiledProgramScope::~CompiledProgramScope() { in_compiled = outer_; }

namespace detail {
void run_nccl_launch_fence() {
  if (in_compiled) return;
  std::shared_ptr<const std::function<void()>> f;
  {
    std::lock_guard lock(mu);
    f = fence;
  }
  if (f) (*f)();
}
}  // namespace detail

}  // namespace shardkit
