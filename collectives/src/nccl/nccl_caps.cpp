// What the NCCL backend implements, declared in every build (with or without NCCL) so that routing reads one answer.

#include "backend.hpp"

namespace shardkit::detail {

bool nccl_min_max_by_keys(DType dtype, ReduceOp reduce) noexcept {
  return (dtype == DType::kFloat32 || dtype == DType::kFloat64) &&
         (reduce == ReduceOp::kMin || reduce == ReduceOp::kMax);
}

bool nccl_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept {
  switch (op) {
    case OpKind::kScan:     // NCCL has no prefix reduction
    case OpKind::kBarrier:  // nor a barrier (and a barrier moves no GPU data)
      return false;
    case OpKind::kAllreduce:
    case OpKind::kReduce:
    case OpKind::kReduceScatter: break;
    default: return true;  // data movement is done on bytes: every dtype
  }
  if (!reduce_op_supports(reduce, dtype)) return false;
  switch (dtype) {
    case DType::kInt16:
    case DType::kUInt16: return false;  // no 16-bit integer type in NCCL
    case DType::kBool:                  // as uint8: and = min, or = max
      return reduce == ReduceOp::kLogicalAnd || reduce == ReduceOp::kLogicalOr || reduce == ReduceOp::kBitAnd ||
             reduce == ReduceOp::kBitOr;
    case DType::kComplex64:
    case DType::kComplex128: return reduce == ReduceOp::kSum;  // as pairs of reals
    default: break;
  }
  // NCCL's float min/max (fminf/fmaxf, __hmin/__hmax) drop a NaN where shardkit propagates it (README, "NaN").
  // allreduce of float32/float64 runs an integer max/min over order keys made in the result buffer itself; the others
  // (no room for the keys: reduce off the root, reduce_scatter, 16-bit floats) go to MPI through pinned staging.
  if (is_floating(dtype) && (reduce == ReduceOp::kMin || reduce == ReduceOp::kMax))
    return op == OpKind::kAllreduce && nccl_min_max_by_keys(dtype, reduce);
  return reduce == ReduceOp::kSum || reduce == ReduceOp::kProd || reduce == ReduceOp::kMin ||
         reduce == ReduceOp::kMax;
}

}  // namespace shardkit::detail
