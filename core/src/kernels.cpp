#include "shardkit/core/kernels.hpp"

#include "kernels_internal.hpp"

namespace shardkit {
namespace {

// Strided device copies on one stream: a non-contiguous array is packed, computed on and unpacked on the stream of
// the kernel itself, so no step can overtake another (and none waits on the host when the caller gave a stream).
Array pack_on(const Array& x, StreamHandle s) {
  Array t = Array::empty(x.shape(), x.dtype(), x.device());
  detail::cuda_strided_copy(t.data(), t.strides().data(), x.data(), x.strides().data(), x.shape().data(), x.ndim(),
                            x.itemsize(), s);
  return t;
}
void unpack_on(const Array& t, Array& x, StreamHandle s) {
  detail::cuda_strided_copy(x.data(), x.strides().data(), t.data(), t.strides().data(), x.shape().data(), x.ndim(),
                            x.itemsize(), s);
}

// After work on the caller's stream: host access to `x` waits for it; without a caller's stream, wait now.
void finish(Array& x, StreamHandle caller, StreamHandle s) {
  if (caller)
    x.set_ready(cuda::record_event(s, x.device().index));
  else
    cuda::synchronize(s);
}

}  // namespace

void scale(Array& x, double factor, StreamHandle stream) {
  SHARDKIT_CHECK(is_floating(x.dtype()) || is_complex(x.dtype()), "scale: dtype ", x.dtype(),
                 " is not a floating or complex type");
  SHARDKIT_CHECK(!x.read_only(), "scale: the array is read-only");
  x.wait_ready();
  if (x.numel() == 0) return;
  if (x.device().is_device_memory()) {
    cuda::DeviceGuard guard(x.device().index);  // kernels launch on the current device's streams only
    const StreamHandle s = stream ? stream : cuda::library_stream(x.device().index);
    if (x.is_contiguous()) {
      detail::cuda_scale(x.data(), x.dtype(), x.numel(), factor, s);
    } else {
      Array tmp = pack_on(x, s);
      detail::cuda_scale(tmp.data(), tmp.dtype(), tmp.numel(), factor, s);
      unpack_on(tmp, x, s);
    }
    finish(x, stream, s);
    return;
  }
  if (!x.is_contiguous()) {
    Array tmp = x.clone();
    scale(tmp, factor, stream);
    x.copy_from(tmp);
    return;
  }
  detail::host_scale(x.data(), x.dtype(), x.numel(), factor);
}

void add_into(Array& y, const Array& x, StreamHandle stream) {
  SHARDKIT_CHECK(y.shape() == x.shape(), "add_into: shapes differ: ", shape_to_string(y.shape()), " vs ",
                 shape_to_string(x.shape()));
  SHARDKIT_CHECK(y.dtype() == x.dtype(), "add_into: dtypes differ: ", y.dtype(), " vs ", x.dtype());
  SHARDKIT_CHECK(y.dtype() != DType::kBool, "add_into: bool arrays cannot be added");
  SHARDKIT_CHECK(!y.read_only(), "add_into: y is read-only");
  SHARDKIT_CHECK(y.device() == x.device(), "add_into: arrays on different devices: ", y.device(), ", ", x.device());
  y.wait_ready();
  x.wait_ready();
  if (y.numel() == 0) return;
  if (y.device().is_device_memory()) {
    cuda::DeviceGuard guard(y.device().index);
    const StreamHandle s = stream ? stream : cuda::library_stream(y.device().index);
    if (y.is_contiguous() && x.is_contiguous()) {
      detail::cuda_add(y.data(), x.data(), y.dtype(), y.numel(), s);
    } else {
      Array ty = y.is_contiguous() ? y : pack_on(y, s);
      Array tx = x.is_contiguous() ? x : pack_on(x, s);
      detail::cuda_add(ty.data(), tx.data(), y.dtype(), y.numel(), s);
      if (!y.is_contiguous()) unpack_on(ty, y, s);
    }
    finish(y, stream, s);
    return;
  }
  if (!y.is_contiguous() || !x.is_contiguous()) {
    Array ty = y.contiguous().clone(), tx = x.contiguous();
    add_into(ty, tx, stream);
    y.copy_from(ty);
    return;
  }
  detail::host_add(y.data(), x.data(), y.dtype(), y.numel());
}

namespace detail {

void host_scale(void* x, DType dtype, std::int64_t n, double factor) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(x);
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, Half>)
        p[i] = float_to_half(half_to_float(p[i]) * static_cast<float>(factor));
      else if constexpr (std::is_same_v<T, BFloat16>)
        p[i] = float_to_bfloat16(bfloat16_to_float(p[i]) * static_cast<float>(factor));
      else if constexpr (std::is_floating_point_v<T>)
        p[i] = static_cast<T>(p[i] * factor);
      else if constexpr (requires { p[i].real(); })
        p[i] *= static_cast<typename T::value_type>(factor);
    }
  });
}

void host_add(void* y, const void* x, DType dtype, std::int64_t n) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* py = static_cast<T*>(y);
    const T* px = static_cast<const T*>(x);
    if constexpr (std::is_same_v<T, Half>) {
      for (std::int64_t i = 0; i < n; ++i) py[i] = float_to_half(half_to_float(py[i]) + half_to_float(px[i]));
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      for (std::int64_t i = 0; i < n; ++i)
        py[i] = float_to_bfloat16(bfloat16_to_float(py[i]) + bfloat16_to_float(px[i]));
    } else if constexpr (!std::is_same_v<T, bool>) {
      for (std::int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(py[i] + px[i]);
    }
  });
}

}  // namespace detail
}  // namespace shardkit
