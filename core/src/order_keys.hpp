#pragma once

// Floats as signed integers of the same width whose integer order is the order of the floats (-0 just below +0), every
// NaN made the largest key or the smallest: an integer max or min over ranks then propagates a NaN that any rank
// holds, which NCCL's float max and min (fmaxf/fminf) do not. Host and device code share these definitions
// (kernels.cpp, cuda/kernels.cu).

#include <cstdint>

#if defined(__CUDACC__)
#define SHARDKIT_HOST_DEVICE __host__ __device__
#else
#define SHARDKIT_HOST_DEVICE
#endif

namespace shardkit::detail {

/// The bits of +infinity; magnitudes above it are NaNs.
template <typename U>
SHARDKIT_HOST_DEVICE constexpr U infinity_bits() {
  if constexpr (sizeof(U) == 4)
    return U{0x7f800000u};
  else
    return U{0x7ff0000000000000ull};
}

/// The key of the float with bits `bits` (U: uint32_t or uint64_t; K: the signed type of the same width).
template <typename U, typename K>
SHARDKIT_HOST_DEVICE constexpr K to_order_key(U bits, bool nan_high) {
  constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  constexpr U magnitude_mask = sign - 1;
  const U magnitude = bits & magnitude_mask;
  if (magnitude > infinity_bits<U>())
    return nan_high ? static_cast<K>(magnitude_mask) : -static_cast<K>(magnitude_mask) - 1;
  return (bits & sign) ? -static_cast<K>(magnitude) - 1 : static_cast<K>(magnitude);
}

/// The bits of the float whose key is `key`: the inverse of to_order_key for every non-NaN float; a NaN's key gives
/// a NaN (all magnitude bits set, positive for the largest key, negative for the smallest).
template <typename U, typename K>
SHARDKIT_HOST_DEVICE constexpr U from_order_key(K key) {
  constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  return key >= 0 ? static_cast<U>(key) : static_cast<U>(sign | static_cast<U>(-(key + 1)));
}

}  // namespace shardkit::detail
