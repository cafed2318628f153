#pragma once

// Private interface between the host code of core and its CUDA kernels (cuda/kernels.cu). In a build without CUDA
// these are implemented by cuda_stub.cpp and throw.

#include <cstddef>
#include <cstdint>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/dtype.hpp"

namespace shardkit::detail {

/// Largest rank the strided kernels handle.
inline constexpr int kMaxKernelDims = 8;

/// Element-wise copy between two strided layouts of the same shape on the device (either side may be host memory
/// that the device can address). Strides are in elements; `elem_size` is 1, 2, 4, 8 or 16.
void cuda_strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem_size, StreamHandle stream);
/// x[i] *= factor for `n` contiguous elements of a floating or complex dtype, on `stream`.
void cuda_scale(void* x, DType dtype, std::int64_t n, double factor, StreamHandle stream);

/// y[i] += x[i] for `n` contiguous elements (floating, complex or integer dtypes), on `stream`.
void cuda_add(void* y, const void* x, DType dtype, std::int64_t n, StreamHandle stream);

/// Sets `bytes` bytes at `dst` to zero on `stream`.
void cuda_memset_zero(void* dst, std::size_t bytes, StreamHandle stream);

/// Order keys (order_keys.hpp) of `n` contiguous float32 (`wide` false) or float64 elements, on `stream`; `keys` may be
/// `x`. from_order_keys: the inverse.
void cuda_to_order_keys(const void* x, void* keys, bool wide, std::int64_t n, bool nan_high, StreamHandle stream);
void cuda_from_order_keys(const void* keys, void* x, bool wide, std::int64_t n, StreamHandle stream);

/// The same on the host (also the simulated GPU's kernels).
void host_to_order_keys(const void* x, void* keys, bool wide, std::int64_t n, bool nan_high);
void host_from_order_keys(const void* keys, void* x, bool wide, std::int64_t n);

/// x[i] *= factor for `n` contiguous elements of a floating or complex dtype, on the host (also the simulated GPU's
/// scale kernel).
void host_scale(void* x, DType dtype, std::int64_t n, double factor);

/// y[i] += x[i] for `n` contiguous elements, on the host (also the simulated GPU's add kernel).
void host_add(void* y, const void* x, DType dtype, std::int64_t n);

/// Host strided copy (any layouts, same shape), with a memcpy fast path for contiguous runs.
void host_strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem_size);

}  // namespace shardkit::detail
