#pragma once

// Element-wise reductions and float16/bfloat16 conversions for the simulated NCCL and cuBLAS.

#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "shardkit/core/float16.hpp"

namespace shardkit::sim {

// core's conversions (one definition, header-only: core links sim), on raw bits.
inline float half_to_float(std::uint16_t h) { return ::shardkit::half_to_float(Half{h}); }
inline std::uint16_t float_to_half(float f) { return ::shardkit::float_to_half(f).bits; }
inline float bf16_to_float(std::uint16_t b) { return ::shardkit::bfloat16_to_float(BFloat16{b}); }
inline std::uint16_t float_to_bf16(float f) { return ::shardkit::float_to_bfloat16(f).bits; }

/// Bytes of one element of `t`; 0 for an unknown type.
std::size_t nccl_type_size(ncclDataType_t t);
/// acc[i] = op(acc[i], x[i]) for `count` elements (ncclAvg sums; finish with divide()).
bool reduce_into(void* acc, const void* x, std::size_t count, ncclDataType_t t, ncclRedOp_t op);
/// acc[i] /= n (the end of ncclAvg).
void divide(void* acc, std::size_t count, ncclDataType_t t, int n);

}  // namespace shardkit::sim
