#include "shardkit/core/kernels.hpp"

#include <cstring>

#include "kernels_internal.hpp"
#include "order_keys.hpp"

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

DType order_key_dtype(DType dtype) {
  if (dtype == DType::kFloat32) return DType::kInt32;
  if (dtype == DType::kFloat64) return DType::kInt64;
  throw InvalidArgument(detail::concat("order keys: dtype ", dtype, " is not float32 or float64"));
}

namespace {

// Checks the pair (floats, keys) and calls `host` or `device` with the element width.
template <typename Host, typename Device>
void order_keys_on(const Array& floats, const Array& keys, StreamHandle stream, const char* what, Host host,
                   Device device) {
  SHARDKIT_CHECK(keys.dtype() == order_key_dtype(floats.dtype()), what, ": keys of dtype ", keys.dtype(), " for ",
                 floats.dtype());
  SHARDKIT_CHECK_EQ(floats.numel(), keys.numel(), what, ": element counts differ");
  SHARDKIT_CHECK(floats.is_contiguous() && keys.is_contiguous(), what, ": the arrays must be contiguous");
  SHARDKIT_CHECK(floats.device() == keys.device(), what, ": arrays on different devices: ", floats.device(), ", ",
                 keys.device());
  const bool wide = floats.dtype() == DType::kFloat64;
  if (floats.numel() == 0) return;
  if (floats.device().is_device_memory()) {
    SHARDKIT_CHECK(stream != nullptr, what, ": CUDA arrays need the stream to enqueue on");
    device(wide, stream);
  } else {
    host(wide);
  }
}

}  // namespace

void to_order_keys(const Array& x, Array& keys, bool nan_high, StreamHandle stream) {
  order_keys_on(
      x, keys, stream, "to_order_keys",
      [&](bool wide) { detail::host_to_order_keys(x.data(), keys.data(), wide, x.numel(), nan_high); },
      [&](bool wide, StreamHandle s) {
        detail::cuda_to_order_keys(x.data(), keys.data(), wide, x.numel(), nan_high, s);
      });
}

void from_order_keys(const Array& keys, Array& x, StreamHandle stream) {
  order_keys_on(
      x, keys, stream, "from_order_keys",
      [&](bool wide) { detail::host_from_order_keys(keys.data(), x.data(), wide, x.numel()); },
      [&](bool wide, StreamHandle s) { detail::cuda_from_order_keys(keys.data(), x.data(), wide, x.numel(), s); });
}

namespace detail {

namespace {
// Element i of `in` (bits of width U) to element i of `out` through f; `in` and `out` may be one buffer (each element
// is read before it is written; memcpy keeps the aliasing well defined).
template <typename U, typename V, typename F>
void map_bits(const void* in, void* out, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) {
    U a;
    std::memcpy(&a, static_cast<const char*>(in) + i * static_cast<std::int64_t>(sizeof(U)), sizeof a);
    const V b = f(a);
    std::memcpy(static_cast<char*>(out) + i * static_cast<std::int64_t>(sizeof(V)), &b, sizeof b);
  }
}
}  // namespace

void host_to_order_keys(const void* x, void* keys, bool wide, std::int64_t n, bool nan_high) {
  if (wide)
    map_bits<std::uint64_t, std::int64_t>(x, keys, n, [=](std::uint64_t b) {
      return to_order_key<std::uint64_t, std::int64_t>(b, nan_high);
    });
  else
    map_bits<std::uint32_t, std::int32_t>(x, keys, n, [=](std::uint32_t b) {
      return to_order_key<std::uint32_t, std::int32_t>(b, nan_high);
    });
}

void host_from_order_keys(const void* keys, void* x, bool wide, std::int64_t n) {
  if (wide)
    map_bits<std::int64_t, std::uint64_t>(keys, x, n, from_order_key<std::uint64_t, std::int64_t>);
  else
    map_bits<std::int32_t, std::uint32_t>(keys, x, n, from_order_key<std::uint32_t, std::int32_t>);
}

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
