#include "backends/mpi/staging.hpp"

#include <bit>
#include <map>
#include <mutex>
#include <vector>

#include "shardkit/collectives/options.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit::detail {
namespace {

class PinnedPool {
 public:
  std::shared_ptr<void> acquire(std::size_t bytes) {
    const std::size_t cls = std::bit_ceil(std::max<std::size_t>(bytes, 4096));
    void* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& free_list = free_[cls];
      if (!free_list.empty()) {
        block = free_list.back();
        free_list.pop_back();
        idle_ -= cls;
      }
    }
    if (!block) {
      block = cuda::malloc_host_pinned(cls);
      std::lock_guard<std::mutex> lock(mu_);
      ++allocated_;
    }
    // The deleter hands the block back; the pool itself lives for the whole process (see pool()).
    return std::shared_ptr<void>(block, [this, cls](void* p) { release(p, cls); });
  }
  std::size_t allocated() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }
  std::size_t idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_;
  }
  std::size_t set_cap(std::size_t bytes) {
    std::vector<void*> drop;
    std::size_t old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      old = cap_;
      cap_ = bytes;
      trim(0, drop);
    }
    for (void* p : drop) cuda::free_host_pinned(p);
    return old;
  }

 private:
  // Keeps the returned block if the idle total stays within the cap, making room by freeing larger idle blocks
  // first (the rarely reused ones); otherwise frees it.
  void release(void* p, std::size_t cls) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      trim(cls, drop);
      if (idle_ + cls <= cap_) {
        free_[cls].push_back(p);
        idle_ += cls;
      } else {
        drop.push_back(p);
      }
    }
    for (void* q : drop) cuda::free_host_pinned(q);  // outside the lock: cudaFreeHost synchronises the device
  }
  // Moves idle blocks into `drop` until `incoming` more bytes fit under the cap (or nothing is idle).
  void trim(std::size_t incoming, std::vector<void*>& drop) {
    for (auto it = free_.rbegin(); it != free_.rend() && idle_ + incoming > cap_;) {
      auto& list = it->second;
      while (!list.empty() && idle_ + incoming > cap_) {
        drop.push_back(list.back());
        list.pop_back();
        idle_ -= it->first;
      }
      ++it;
    }
  }

  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t allocated_ = 0;
  std::size_t idle_ = 0;
  std::size_t cap_ = ProcessSettings::current().staging_pool_bytes;
};

PinnedPool& pool() {
  // Never destroyed: blocks may be returned during static destruction, and freeing pinned memory then races the
  // CUDA runtime's own teardown.
  static auto* p = new PinnedPool();
  return *p;
}

}  // namespace

Array pinned_like(const Array& like) {
  std::shared_ptr<void> block = pool().acquire(like.nbytes());
  void* data = block.get();
  return Array::borrow(data, like.shape(), like.dtype(), Device::cuda_host(), std::move(block));
}

std::size_t pinned_blocks_allocated() { return pool().allocated(); }
std::size_t pinned_idle_bytes() { return pool().idle(); }
std::size_t set_pinned_pool_cap(std::size_t bytes) { return pool().set_cap(bytes); }

}  // namespace shardkit::detail
