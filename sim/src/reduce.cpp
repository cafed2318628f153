#include "reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace shardkit::sim {

std::size_t nccl_type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

namespace {

// Integer sums and products wrap modulo 2^bits, as on the device: computed in an unsigned type at least as wide as
// `unsigned` (signed overflow is undefined in C++, and narrow types promote to a signed int).
template <typename T, bool = std::is_integral_v<T>>
struct ArithOf {
  using type = T;
};
template <typename T>
struct ArithOf<T, true> {
  using type = std::make_unsigned_t<std::conditional_t<(sizeof(T) < sizeof(int)), int, T>>;
};
template <typename T>
using Arith = typename ArithOf<T>::type;

template <typename T>
T apply(T a, T b, ncclRedOp_t op) {
  using A = Arith<T>;
  switch (op) {
    case ncclSum: case ncclAvg: return static_cast<T>(static_cast<A>(a) + static_cast<A>(b));
    case ncclProd: return static_cast<T>(static_cast<A>(a) * static_cast<A>(b));
    // As NCCL's kernels: fminf/fmaxf on floats and __hmin/__hmax on 16-bit ones drop a NaN (the other operand wins).
    case ncclMin:
      if constexpr (std::is_floating_point_v<T>) return std::fmin(a, b);
      return std::min(a, b);
    case ncclMax:
      if constexpr (std::is_floating_point_v<T>) return std::fmax(a, b);
      return std::max(a, b);
    default: return a;
  }
}

template <typename T>
void loop(void* acc, const void* x, std::size_t n, ncclRedOp_t op) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(x);
  for (std::size_t i = 0; i < n; ++i) a[i] = apply(a[i], b[i], op);
}

template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void loop16(void* acc, const void* x, std::size_t n, ncclRedOp_t op) {
  auto* a = static_cast<std::uint16_t*>(acc);
  const auto* b = static_cast<const std::uint16_t*>(x);
  for (std::size_t i = 0; i < n; ++i) a[i] = Store(apply(Load(a[i]), Load(b[i]), op));
}

}  // namespace

bool reduce_into(void* acc, const void* x, std::size_t n, ncclDataType_t t, ncclRedOp_t op) {
  if (op != ncclSum && op != ncclProd && op != ncclMin && op != ncclMax && op != ncclAvg) return false;
  switch (t) {
    case ncclInt8: loop<std::int8_t>(acc, x, n, op); return true;
    case ncclUint8: loop<std::uint8_t>(acc, x, n, op); return true;
    case ncclInt32: loop<std::int32_t>(acc, x, n, op); return true;
    case ncclUint32: loop<std::uint32_t>(acc, x, n, op); return true;
    case ncclInt64: loop<std::int64_t>(acc, x, n, op); return true;
    case ncclUint64: loop<std::uint64_t>(acc, x, n, op); return true;
    case ncclFloat32: loop<float>(acc, x, n, op); return true;
    case ncclFloat64: loop<double>(acc, x, n, op); return true;
    case ncclFloat16: loop16<half_to_float, float_to_half>(acc, x, n, op); return true;
    case ncclBfloat16: loop16<bf16_to_float, float_to_bf16>(acc, x, n, op); return true;
    default: return false;
  }
}

namespace {
template <typename T>
void div_loop(void* acc, std::size_t n, int d) {
  T* a = static_cast<T*>(acc);
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<T>(a[i] / static_cast<T>(d));
}
}  // namespace

void divide(void* acc, std::size_t n, ncclDataType_t t, int d) {
  switch (t) {
    case ncclInt8: return div_loop<std::int8_t>(acc, n, d);
    case ncclUint8: return div_loop<std::uint8_t>(acc, n, d);
    case ncclInt32: return div_loop<std::int32_t>(acc, n, d);
    case ncclUint32: return div_loop<std::uint32_t>(acc, n, d);
    case ncclInt64: return div_loop<std::int64_t>(acc, n, d);
    case ncclUint64: return div_loop<std::uint64_t>(acc, n, d);
    case ncclFloat32: return div_loop<float>(acc, n, d);
    case ncclFloat64: return div_loop<double>(acc, n, d);
    case ncclFloat16: {
      auto* a = static_cast<std::uint16_t*>(acc);
      for (std::size_t i = 0; i < n; ++i) a[i] = float_to_half(half_to_float(a[i]) / static_cast<float>(d));
      return;
    }
    case ncclBfloat16: {
      auto* a = static_cast<std::uint16_t*>(acc);
      for (std::size_t i = 0; i < n; ++i) a[i] = float_to_bf16(bf16_to_float(a[i]) / static_cast<float>(d));
      return;
    }
    default: return;
  }
}

}  // namespace shardkit::sim
