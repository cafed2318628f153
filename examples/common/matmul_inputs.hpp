#pragma once

// Inputs of the matmul example and benchmark: deterministic values by global index, so every rank fills its own
// block of A and B without anything being sent, and a one-rank reference can rebuild the whole matrices.

#include <cstdint>

#include "shardkit/core/array.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace shardkit::examples {

/// Element (i, j) of matrix `which` (0: A, 1: B): a value in [-1, 1) from a 64-bit hash of the position.
inline double matrix_value(int which, std::int64_t i, std::int64_t j) {
  std::uint64_t h = (static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::uint64_t>(j) + 0x632BE59BD9B4E019ull) ^
                    (static_cast<std::uint64_t>(which) << 60);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<double>(h >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/// Rows [r0, r1) x columns [c0, c1) of matrix `which`, as a host array of `dtype` (float32/float64/float16/bfloat16).
inline Array matrix_block(int which, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, DType dtype) {
  Array out = Array::empty({r1 - r0, c1 - c0}, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data());
    for (std::int64_t i = r0; i < r1; ++i)
      for (std::int64_t j = c0; j < c1; ++j) {
        const double v = matrix_value(which, i, j);
        T& dst = p[(i - r0) * (c1 - c0) + (j - c0)];
        if constexpr (std::is_same_v<T, Half>)
          dst = float_to_half(static_cast<float>(v));
        else if constexpr (std::is_same_v<T, BFloat16>)
          dst = float_to_bfloat16(static_cast<float>(v));
        else if constexpr (std::is_floating_point_v<T>)
          dst = static_cast<T>(v);
        else
          dst = T{};
      }
  });
  return out;
}

/// This rank's block of matrix `which` (global `shape`) under `sharding`, as a ShardedArray on `device`: no
/// communication.
inline ShardedArray matrix_sharded(int which, const Shape& shape, const NamedSharding& sharding, DType dtype,
                                   Device device) {
  const auto idx = sharding.index(shape, sharding.mesh().rank());
  Array block = matrix_block(which, idx[0].start, idx[0].stop, idx[1].start, idx[1].stop, dtype);
  return from_local(device == Device::cpu() ? block : block.to(device), shape, sharding);
}

/// The input layouts each algorithm works on directly, for a mesh (the tuple of all axes cuts rows; SUMMA uses the
/// mesh's two axes). @throws InvalidArgument for SUMMA on a mesh that is not 2-d.
inline std::pair<PartitionSpec, PartitionSpec> natural_layout(MatmulAlgorithm alg, const Mesh& mesh) {
  const MatmulLayout layout = matmul_layout(alg, mesh);
  return {layout.a, layout.b};
}

}  // namespace shardkit::examples
