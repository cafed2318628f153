#include <cstring>
#include <vector>

#include "kernels_internal.hpp"
#include "shardkit/core/array.hpp"

namespace shardkit {
namespace {

// Copies between a CUDA-side array and anything else. Pageable host memory is not device-addressable, so a strided
// pageable side is first packed on the host and a strided device side is packed on the device.
void cuda_copy(const Array& src, Array& dst) {
  const int dev = dst.device().kind != DeviceKind::kCPU && dst.device().kind != DeviceKind::kCUDAHost
                      ? dst.device().index
                      : src.device().index;
  // Kernels launch on the current device's streams only: this thread may be on another one (a helper thread starts
  // on device 0).
  cuda::DeviceGuard guard(dev);
  const StreamHandle stream = cuda::library_stream(dev);
  const bool src_addressable = src.device().kind != DeviceKind::kCPU;
  const bool dst_addressable = dst.device().kind != DeviceKind::kCPU;

  if (src.is_contiguous() && dst.is_contiguous()) {
    cuda::memcpy_async(dst.data(), src.data(), dst.nbytes(), stream);
    cuda::synchronize(stream);
    return;
  }
  if (src_addressable && dst_addressable) {
    detail::cuda_strided_copy(dst.data(), dst.strides().data(), src.data(), src.strides().data(), dst.shape().data(),
                              dst.ndim(), dst.itemsize(), stream);
    cuda::synchronize(stream);
    return;
  }
  // One side is pageable host memory: stage through a contiguous buffer on the other side's terms.
  if (!src_addressable) {
    Array packed = src.contiguous();  // host pack
    Array staged = Array::empty(src.shape(), src.dtype(), Device::cuda(dev));
    cuda::memcpy_async(staged.data(), packed.data(), packed.nbytes(), stream);
    detail::cuda_strided_copy(dst.data(), dst.strides().data(), staged.data(), staged.strides().data(),
                              dst.shape().data(), dst.ndim(), dst.itemsize(), stream);
    cuda::synchronize(stream);
    return;
  }
  Array packed = Array::empty(src.shape(), src.dtype(), Device::cuda(dev));
  detail::cuda_strided_copy(packed.data(), packed.strides().data(), src.data(), src.strides().data(),
                            src.shape().data(), src.ndim(), src.itemsize(), stream);
  Array host = Array::empty(src.shape(), src.dtype(), Device::cpu());
  cuda::memcpy_async(host.data(), packed.data(), packed.nbytes(), stream);
  cuda::synchronize(stream);
  detail::host_strided_copy(dst.data(), dst.strides().data(), host.data(), host.strides().data(), dst.shape().data(),
                            dst.ndim(), dst.itemsize());
}

}  // namespace

void copy(const Array& src, Array& dst) {
  SHARDKIT_CHECK(src.shape() == dst.shape(), "copy: shapes differ: ", shape_to_string(src.shape()), " vs ",
                 shape_to_string(dst.shape()));
  SHARDKIT_CHECK(src.dtype() == dst.dtype(), "copy: dtypes differ: ", src.dtype(), " vs ", dst.dtype());
  SHARDKIT_CHECK(!dst.read_only(), "cannot write into a read-only array");
  src.wait_ready();
  dst.wait_ready();
  if (src.numel() == 0 || src.data() == dst.data()) return;
  // Managed memory is device memory here: kernels on any stream may still be writing it, so it goes through the
  // stream-ordered path (which synchronises) rather than a host memcpy.
  if (!src.device().is_device_memory() && !dst.device().is_device_memory()) {
    detail::host_strided_copy(dst.data(), dst.strides().data(), src.data(), src.strides().data(), dst.shape().data(),
                              dst.ndim(), dst.itemsize());
    return;
  }
  cuda_copy(src, dst);
}

namespace detail {

void host_strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem_size) {
  std::int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) numel *= shape[i];
  if (numel == 0) return;
  // Fold trailing dimensions that are contiguous in both layouts into one memcpy run.
  int inner = ndim;
  std::int64_t run = 1;
  while (inner > 0 && dst_strides[inner - 1] == run && src_strides[inner - 1] == run) {
    run *= shape[inner - 1];
    --inner;
  }
  const std::size_t run_bytes = static_cast<std::size_t>(run) * elem_size;
  if (inner == 0) {
    std::memcpy(dst, src, run_bytes);
    return;
  }
  // Odometer over the outer dimensions [0, inner).
  std::vector<std::int64_t> idx(inner, 0);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const auto es = static_cast<std::int64_t>(elem_size);
  const std::int64_t outer_count = numel / run;
  for (std::int64_t n = 0; n < outer_count; ++n) {
    std::int64_t doff = 0, soff = 0;
    for (int k = 0; k < inner; ++k) {
      doff += idx[k] * dst_strides[k];
      soff += idx[k] * src_strides[k];
    }
    if (run == 1) {
      std::memcpy(d + doff * es, s + soff * es, elem_size);
    } else {
      std::memcpy(d + doff * es, s + soff * es, run_bytes);
    }
    for (int k = inner - 1; k >= 0; --k) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace detail

}  // namespace shardkit
