#pragma once

// How the NCCL backend reduces each dtype with each reduction, stated once (nccl_caps.cpp) and read by both the
// router's declaration (nccl_supports) and the backend's calls (nccl_backend.cpp). Compiled in every build, so nothing
// here includes nccl.h: NcclType and NcclOp carry the values of ncclDataType_t and ncclRedOp_t, which
// nccl_backend.cpp checks with static_asserts and passes to NCCL as they are.

#include <string>

#include "shardkit/collectives/ops.hpp"

namespace shardkit::detail {

/// NCCL's element types (ncclDataType_t's values); kNone where NCCL has no type for a dtype.
enum class NcclType : int {
  kNone = -1,
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};

/// NCCL's reductions (ncclRedOp_t's values); kNone where the NCCL backend has none for a reduction.
enum class NcclOp : int { kNone = -1, kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

/// How NCCL runs one reduction of one dtype.
struct NcclReduction {
  NcclType type = NcclType::kNone;  ///< the NCCL type the elements are reduced as; kNone: NCCL cannot run it
  NcclOp op = NcclOp::kNone;        ///< the NCCL reduction
  int lanes = 1;                    ///< NCCL elements per element (2 for complex: a pair of reals)
  /// True for float32/float64 max/min: NCCL's float max/min drop NaN, so they run as an integer max/min over order
  /// keys (core's to_order_keys; `type` is the keys' type), made in the result buffer: allreduce only.
  bool by_order_keys = false;
};

/// How NCCL runs `op` over `dtype` (type kNone when it cannot, or when `op` is not defined for `dtype`).
NcclReduction nccl_reduction(ReduceOp op, DType dtype) noexcept;
/// Why NCCL cannot run `op` over `dtype` in `kind` ("NCCL reduces bool only with land, lor, band, bor (got 'lxor');
/// use the MPI backend"); for messages, when nccl_supports(kind, dtype, op) is false.
std::string nccl_refusal(OpKind kind, ReduceOp op, DType dtype);

}  // namespace shardkit::detail
