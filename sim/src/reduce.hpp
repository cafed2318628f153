#pragma once

// Element-wise reductions and float16/bfloat16 conversions for the simulated NCCL and cuBLAS.

#include <nccl.h>

#include <cstddef>
#include <cstdint>

namespace shardkit::sim {

float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bf16_to_float(std::uint16_t b);
std::uint16_t float_to_bf16(float f);

/// Bytes of one element of `t`; 0 for an unknown type.
std::size_t nccl_type_size(ncclDataType_t t);
/// acc[i] = op(acc[i], x[i]) for `count` elements (ncclAvg sums; finish with divide()).
bool reduce_into(void* acc, const void* x, std::size_t count, ncclDataType_t t, ncclRedOp_t op);
/// acc[i] /= n (the end of ncclAvg).
void divide(void* acc, std::size_t count, ncclDataType_t t, int n);

}  // namespace shardkit::sim
