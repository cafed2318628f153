#include "array_compare.hpp"

#include <algorithm>
#include <cmath>

namespace shardkit {

bool allclose(const Array& a, const Array& b, double rtol, double atol) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Array ha = a.to(Device::cpu());
  const Array hb = b.to(Device::cpu());
  return visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(ha.data());
    const T* pb = static_cast<const T*>(hb.data());
    for (std::int64_t i = 0; i < ha.numel(); ++i) {
      if constexpr (std::is_integral_v<T>) {
        if (pa[i] != pb[i]) return false;
      } else if constexpr (requires { pa[i].real(); }) {
        if (std::abs(pa[i] - pb[i]) > atol + rtol * std::abs(pb[i])) return false;
      } else {
        const double x = to_double(pa[i]), y = to_double(pb[i]);
        if (std::isnan(x) || std::isnan(y) || std::abs(x - y) > atol + rtol * std::abs(y)) return false;
      }
    }
    return true;
  });
}

double max_relative_error(const Array& a, const Array& b) {
  SHARDKIT_CHECK(a.shape() == b.shape(), "max_relative_error: shapes differ: ", shape_to_string(a.shape()), " vs ",
                 shape_to_string(b.shape()));
  SHARDKIT_CHECK(a.dtype() == b.dtype(), "max_relative_error: dtypes differ");
  const Array ha = a.to(Device::cpu());
  const Array hb = b.to(Device::cpu());
  double worst = 0.0, scale = 0.0;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (requires(T v) { v.real(); }) {
      const T* pa = static_cast<const T*>(ha.data());
      const T* pb = static_cast<const T*>(hb.data());
      for (std::int64_t i = 0; i < ha.numel(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(pa[i] - pb[i])));
        scale = std::max(scale, static_cast<double>(std::abs(pb[i])));
      }
    } else {
      const T* pa = static_cast<const T*>(ha.data());
      const T* pb = static_cast<const T*>(hb.data());
      for (std::int64_t i = 0; i < ha.numel(); ++i) {
        const double x = to_double(pa[i]), y = to_double(pb[i]);
        worst = std::max(worst, std::isnan(x - y) ? INFINITY : std::abs(x - y));
        scale = std::max(scale, std::abs(y));
      }
    }
  });
  // Relative to the largest reference magnitude: the error measure GEMM checks use (elementwise relative error is
  // meaningless where the reference is near zero).
  return worst / std::max(scale, 1e-300);
}

}  // namespace shardkit
