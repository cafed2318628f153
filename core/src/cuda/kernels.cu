// Core's CUDA kernels:
//  - strided_copy_kernel: element-wise copy between two strided layouts of one shape. Used by Array copies of
//    non-contiguous device arrays and by the pack/unpack steps of collectives on non-leading dimensions.
//  - scale_kernel: x *= factor, the element-wise helper of examples and tests (shardkit::scale).
//  - add_kernel: y += x, used by the reduce-scatter flavour of collective matmul (shardkit::add_into).
//  - to_order_keys_kernel / from_order_keys_kernel: float32/float64 to and from integer order keys (order_keys.hpp),
//    around the NCCL backend's integer max/min that stands in for NCCL's float max/min (which drop NaN).
// Zero-filling uses cudaMemsetAsync; no kernel is needed for it.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../kernels_internal.hpp"
#include "../order_keys.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::detail {
namespace {

struct Layout {
  std::int64_t shape[kMaxKernelDims];
  std::int64_t dst_strides[kMaxKernelDims];
  std::int64_t src_strides[kMaxKernelDims];
  int ndim;
};

struct alignas(8) Bytes16 {
  std::uint64_t lo, hi;
};

template <typename T>
__global__ void strided_copy_kernel(T* dst, const T* src, Layout layout, std::int64_t numel) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    std::int64_t rest = i, doff = 0, soff = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const std::int64_t k = rest % layout.shape[d];
      rest /= layout.shape[d];
      doff += k * layout.dst_strides[d];
      soff += k * layout.src_strides[d];
    }
    dst[doff] = src[soff];
  }
}

template <typename T>
void launch(void* dst, const void* src, const Layout& layout, std::int64_t numel, StreamHandle stream) {
  constexpr int kThreads = 256;
  const std::int64_t blocks = (numel + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  strided_copy_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), layout, numel);
  SHARDKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cuda_strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem_size, StreamHandle stream) {
  SHARDKIT_CHECK(ndim <= kMaxKernelDims, "strided copy of rank ", ndim, " exceeds ", kMaxKernelDims);
  Layout layout{};
  layout.ndim = ndim;
  std::int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    layout.shape[d] = shape[d];
    layout.dst_strides[d] = dst_strides[d];
    layout.src_strides[d] = src_strides[d];
    numel *= shape[d];
  }
  if (numel == 0) return;
  switch (elem_size) {
    case 1: return launch<std::uint8_t>(dst, src, layout, numel, stream);
    case 2: return launch<std::uint16_t>(dst, src, layout, numel, stream);
    case 4: return launch<std::uint32_t>(dst, src, layout, numel, stream);
    case 8: return launch<std::uint64_t>(dst, src, layout, numel, stream);
    case 16: return launch<Bytes16>(dst, src, layout, numel, stream);
    default: break;
  }
  throw InvalidArgument(concat("strided copy: unsupported element size ", elem_size));
}

namespace {

template <typename T, typename F>
__global__ void scale_kernel(T* x, std::int64_t n, F factor) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = static_cast<T>(static_cast<F>(x[i]) * factor);
}

template <typename T, typename F>
void launch_scale(void* x, std::int64_t n, F factor, StreamHandle stream) {
  constexpr int kThreads = 256;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  scale_kernel<T, F><<<static_cast<int>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(static_cast<T*>(x), n,
                                                                                                   factor);
  SHARDKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cuda_scale(void* x, DType dtype, std::int64_t n, double factor, StreamHandle stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kFloat16: return launch_scale<__half, float>(x, n, static_cast<float>(factor), stream);
    case DType::kBFloat16: return launch_scale<__nv_bfloat16, float>(x, n, static_cast<float>(factor), stream);
    case DType::kFloat32: return launch_scale<float, float>(x, n, static_cast<float>(factor), stream);
    case DType::kFloat64: return launch_scale<double, double>(x, n, factor, stream);
    // Complex: both parts scale by the same real factor.
    case DType::kComplex64: return launch_scale<float, float>(x, 2 * n, static_cast<float>(factor), stream);
    case DType::kComplex128: return launch_scale<double, double>(x, 2 * n, factor, stream);
    default: break;
  }
  throw InvalidArgument(concat("scale: dtype ", dtype, " is not a floating or complex type"));
}

namespace {

template <typename T>
__global__ void add_kernel(T* y, const T* x, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = y[i] + x[i];
}

template <typename T>
void launch_add(void* y, const void* x, std::int64_t n, StreamHandle stream) {
  constexpr int kThreads = 256;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  add_kernel<T><<<static_cast<int>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(
      static_cast<T*>(y), static_cast<const T*>(x), n);
  SHARDKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cuda_add(void* y, const void* x, DType dtype, std::int64_t n, StreamHandle stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kInt8: return launch_add<std::int8_t>(y, x, n, stream);
    case DType::kInt16: return launch_add<std::int16_t>(y, x, n, stream);
    case DType::kInt32: return launch_add<std::int32_t>(y, x, n, stream);
    case DType::kInt64: return launch_add<std::int64_t>(y, x, n, stream);
    case DType::kUInt8: return launch_add<std::uint8_t>(y, x, n, stream);
    case DType::kUInt16: return launch_add<std::uint16_t>(y, x, n, stream);
    case DType::kUInt32: return launch_add<std::uint32_t>(y, x, n, stream);
    case DType::kUInt64: return launch_add<std::uint64_t>(y, x, n, stream);
    case DType::kFloat16: return launch_add<__half>(y, x, n, stream);
    case DType::kBFloat16: return launch_add<__nv_bfloat16>(y, x, n, stream);
    case DType::kFloat32: return launch_add<float>(y, x, n, stream);
    case DType::kFloat64: return launch_add<double>(y, x, n, stream);
    case DType::kComplex64: return launch_add<float>(y, x, 2 * n, stream);
    case DType::kComplex128: return launch_add<double>(y, x, 2 * n, stream);
    default: break;
  }
  throw InvalidArgument(concat("add_into: dtype ", dtype, " is not supported"));
}

namespace {

// Each thread reads its element before writing it: `in` and `out` may be one buffer.
template <typename U, typename K>
__global__ void to_order_keys_kernel(const U* in, K* out, std::int64_t n, bool nan_high) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = to_order_key<U, K>(in[i], nan_high);
}

template <typename U, typename K>
__global__ void from_order_keys_kernel(const K* in, U* out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_order_key<U, K>(in[i]);
}

int grid_for(std::int64_t n, int threads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? blocks : 65535);
}

}  // namespace

void cuda_to_order_keys(const void* x, void* keys, bool wide, std::int64_t n, bool nan_high, StreamHandle stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (wide)
    to_order_keys_kernel<std::uint64_t, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const std::uint64_t*>(x), static_cast<std::int64_t*>(keys), n, nan_high);
  else
    to_order_keys_kernel<std::uint32_t, std::int32_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const std::uint32_t*>(x), static_cast<std::int32_t*>(keys), n, nan_high);
  SHARDKIT_CUDA_CHECK(cudaGetLastError());
}

void cuda_from_order_keys(const void* keys, void* x, bool wide, std::int64_t n, StreamHandle stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (wide)
    from_order_keys_kernel<std::uint64_t, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const std::int64_t*>(keys), static_cast<std::uint64_t*>(x), n);
  else
    from_order_keys_kernel<std::uint32_t, std::int32_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const std::int32_t*>(keys), static_cast<std::uint32_t*>(x), n);
  SHARDKIT_CUDA_CHECK(cudaGetLastError());
}

void cuda_memset_zero(void* dst, std::size_t bytes, StreamHandle stream) {
  if (bytes) SHARDKIT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
}

}  // namespace shardkit::detail
