// Core's kernels on the simulated GPU (SHARDKIT_SIM_GPU): the launch functions of kernels.cu with the same
// declarations, each enqueueing a host loop on the stream's worker, which reads and writes device memory through
// its worker view. kernels.cu itself is device code for nvcc; what this file proves is the ordering around the
// launches, not the kernels' device code.

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "../kernels_internal.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/sim/sim.hpp"

namespace shardkit::detail {
namespace {

void launch(StreamHandle stream, std::function<void()> kernel) {
  SHARDKIT_CUDA_CHECK(static_cast<cudaError_t>(sim::launch(stream, std::move(kernel))));
}

template <typename T>
T* view(void* p) {
  return static_cast<T*>(sim::worker_view(p));
}

}  // namespace

void cuda_strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem_size, StreamHandle stream) {
  SHARDKIT_CHECK(ndim <= kMaxKernelDims, "strided copy of rank ", ndim, " exceeds ", kMaxKernelDims);
  std::array<std::int64_t, kMaxKernelDims> ds{}, ss{}, sh{};
  std::int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    ds[d] = dst_strides[d];
    ss[d] = src_strides[d];
    sh[d] = shape[d];
    numel *= shape[d];
  }
  if (numel == 0) return;
  SHARDKIT_CHECK(elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8 || elem_size == 16,
                 "strided copy: element size ", elem_size);
  launch(stream, [=] {
    char* d = view<char>(dst);
    const char* s = view<const char>(const_cast<void*>(src));
    for (std::int64_t i = 0; i < numel; ++i) {
      std::int64_t rest = i, doff = 0, soff = 0;
      for (int k = ndim - 1; k >= 0; --k) {
        const std::int64_t idx = rest % sh[k];
        rest /= sh[k];
        doff += idx * ds[k];
        soff += idx * ss[k];
      }
      std::memcpy(d + doff * static_cast<std::int64_t>(elem_size), s + soff * static_cast<std::int64_t>(elem_size),
                  elem_size);
    }
  });
}

void cuda_scale(void* x, DType dtype, std::int64_t n, double factor, StreamHandle stream) {
  SHARDKIT_CHECK(is_floating(dtype) || is_complex(dtype), "scale: dtype ", dtype, " is not supported");
  launch(stream, [=] { host_scale(view<void>(x), dtype, n, factor); });
}

void cuda_add(void* y, const void* x, DType dtype, std::int64_t n, StreamHandle stream) {
  SHARDKIT_CHECK(dtype != DType::kBool, "add_into: dtype ", dtype, " is not supported");
  launch(stream, [=] { host_add(view<void>(y), view<const void>(const_cast<void*>(x)), dtype, n); });
}

void cuda_to_order_keys(const void* x, void* keys, bool wide, std::int64_t n, bool nan_high, StreamHandle stream) {
  launch(stream, [=] {
    host_to_order_keys(view<const void>(const_cast<void*>(x)), view<void>(keys), wide, n, nan_high);
  });
}

void cuda_from_order_keys(const void* keys, void* x, bool wide, std::int64_t n, StreamHandle stream) {
  launch(stream, [=] { host_from_order_keys(view<const void>(const_cast<void*>(keys)), view<void>(x), wide, n); });
}

void cuda_memset_zero(void* dst, std::size_t bytes, StreamHandle stream) {
  if (bytes) SHARDKIT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
}

}  // namespace shardkit::detail
