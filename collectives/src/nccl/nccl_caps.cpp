// What the NCCL backend implements, declared in every build (with or without NCCL) so that routing reads one answer.

#include "backend.hpp"

namespace shardkit::detail {

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
  // NCCL's float min/max (fminf/fmaxf, __hmin/__hmax) drop a NaN where shardkit propagates it (README, "NaN"): those
  // go to MPI, through pinned staging, with shardkit's own reductions.
  if (is_floating(dtype) && (reduce == ReduceOp::kMin || reduce == ReduceOp::kMax)) return false;
  return reduce == ReduceOp::kSum || reduce == ReduceOp::kProd || reduce == ReduceOp::kMin ||
         reduce == ReduceOp::kMax;
}

}  // namespace shardkit::detail
