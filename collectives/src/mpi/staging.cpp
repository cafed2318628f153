#include "mpi/staging.hpp"

#include <bit>
#include <map>
#include <mutex>
#include <vector>

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
      }
    }
    if (!block) {
      block = cuda::malloc_host_pinned(cls);
      std::lock_guard<std::mutex> lock(mu_);
      ++allocated_;
    }
    // The deleter hands the block back; the pool itself lives for the whole process (see pool()).
    return std::shared_ptr<void>(block, [this, cls](void* p) {
      std::lock_guard<std::mutex> lock(mu_);
      free_[cls].push_back(p);
    });
  }
  std::size_t allocated() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t allocated_ = 0;
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

}  // namespace shardkit::detail
