#include "allocate.hpp"

#include <algorithm>
#include <cstdint>
#include <new>

#include <sys/mman.h>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

constexpr std::size_t kHostAlignment = 64;

// Large host buffers (GEMM operands and results, whole shards) come straight from mmap, 2 MiB aligned and marked for
// transparent huge pages: glibc maps allocations this large afresh each time anyway, and first touch faults in far
// fewer huge pages than 4 KiB ones. Below this size glibc's heap reuses freed memory, which is cheaper still. Where
// the kernel ignores the advice, this is an ordinary mapping.
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kLargeHostAllocation = std::size_t{32} << 20;

std::shared_ptr<void> allocate_large_host(std::size_t bytes) {
  const std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw BackendError("host", 0, concat("out of host memory allocating ", bytes, " bytes"));
  // Keep the 2 MiB aligned part, give back the slack on either side.
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  if (const std::size_t tail = start + size + kHugePage - (aligned + size); tail > 0)
    munmap(reinterpret_cast<void*>(aligned + size), tail);
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  (void)madvise(p, size, MADV_HUGEPAGE);  // advice only: nothing to do when it is refused
#endif
  try {
    return std::shared_ptr<void>(p, [size](void* q) { munmap(q, size); });
  } catch (...) {
    munmap(p, size);
    throw;
  }
}

}  // namespace

std::shared_ptr<void> allocate(std::size_t bytes, Device device) {
  // Never hand out a null pointer, even for empty arrays: some consumers treat null data as malformed.
  const std::size_t n = std::max<std::size_t>(bytes, 1);
  switch (device.kind) {
    case DeviceKind::kCPU: {
      if (n >= kLargeHostAllocation) return allocate_large_host(n);
      // One allocation for the control block and the (uninitialised, 64-byte aligned) data: every collective's
      // result is made here, and small ones are dominated by allocator work.
      struct alignas(kHostAlignment) Line {
        std::byte b[kHostAlignment];
      };
      try {
        return std::make_shared_for_overwrite<Line[]>((n + kHostAlignment - 1) / kHostAlignment);
      } catch (const std::bad_alloc&) {
        throw BackendError("host", 0, concat("out of host memory allocating ", bytes, " bytes"));
      }
    }
    case DeviceKind::kCUDA:
      return std::shared_ptr<void>(cuda::malloc_device(n, device.index), [](void* q) { cuda::free_device(q); });
    case DeviceKind::kCUDAHost:
      return std::shared_ptr<void>(cuda::malloc_host_pinned(n), [](void* q) { cuda::free_host_pinned(q); });
    case DeviceKind::kCUDAManaged:
      break;
  }
  return std::shared_ptr<void>(cuda::malloc_managed(n, device.index), [](void* q) { cuda::free_device(q); });
}

}  // namespace shardkit::detail
