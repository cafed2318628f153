#include "shardkit/core/kernels.hpp"

#include "kernels_internal.hpp"

namespace shardkit {

void scale(Array& x, double factor, StreamHandle stream) {
  SHARDKIT_CHECK(is_floating(x.dtype()) || is_complex(x.dtype()), "scale: dtype ", x.dtype(),
                 " is not a floating or complex type");
  SHARDKIT_CHECK(!x.read_only(), "scale: the array is read-only");
  x.wait_ready();
  if (x.numel() == 0) return;
  if (!x.is_contiguous()) {
    Array tmp = x.clone();
    scale(tmp, factor, stream);
    x.copy_from(tmp);
    return;
  }
  if (x.device().kind == DeviceKind::kCUDA) {
    const StreamHandle s = stream ? stream : cuda::library_stream(x.device().index);
    detail::cuda_scale(x.data(), x.dtype(), x.numel(), factor, s);
    if (!stream) cuda::synchronize(s);
    return;
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(x.data());
    for (std::int64_t i = 0; i < x.numel(); ++i) {
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

}  // namespace shardkit
