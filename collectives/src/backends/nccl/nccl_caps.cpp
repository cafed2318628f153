// What the NCCL backend implements, declared in every build (with or without NCCL) so that routing reads one answer,
// and how it reduces each dtype (nccl_caps.hpp): one table, read by nccl_supports and by the backend's calls.

#include "nccl_caps.hpp"

#include <array>

#include "backend.hpp"
#include "shardkit/core/kernels.hpp"
#include "backends/nccl/nccl_backend.hpp"

namespace shardkit::detail {
namespace {

// What each reduction becomes in NCCL for a dtype, in ReduceOp order (sum, prod, min, max, land, lor, lxor, band,
// bor, bxor); kNo: NCCL has no such reduction for it.
using OpColumn = std::array<NcclOp, kReduceOpCount>;
constexpr NcclOp kNo = NcclOp::kNone;
constexpr OpColumn kArithmetic = {NcclOp::kSum, NcclOp::kProd, NcclOp::kMin, NcclOp::kMax, kNo,
                                  kNo,          kNo,           kNo,          kNo,          kNo};
// NCCL's float max/min (fmaxf/fminf, __hmax/__hmin) drop a NaN where shardkit propagates it (docs/cpp.md, "NaN and rounding").
constexpr OpColumn kFloat = {NcclOp::kSum, NcclOp::kProd, kNo, kNo, kNo, kNo, kNo, kNo, kNo, kNo};
// Complex as pairs of reals: only the sum is a sum of the parts.
constexpr OpColumn kSumOnly = {NcclOp::kSum, kNo, kNo, kNo, kNo, kNo, kNo, kNo, kNo, kNo};
// Bool as uint8 0/1: and is min, or is max.
constexpr OpColumn kAndOr = {kNo, kNo, kNo, kNo, NcclOp::kMin, NcclOp::kMax, kNo, NcclOp::kMin, NcclOp::kMax, kNo};
constexpr OpColumn kNoReductions = {kNo, kNo, kNo, kNo, kNo, kNo, kNo, kNo, kNo, kNo};

struct NcclTypeRow {
  DType dtype;
  NcclType type;         // kNone: NCCL has no type for it
  int lanes;             // NCCL elements per element
  OpColumn ops;          // by ReduceOp
  bool min_max_by_keys;  // max/min as an integer max/min over order keys (order_key_dtype's NCCL type)
};

// One row per DType, in DType order.
constexpr NcclTypeRow kNcclTypes[] = {
    {DType::kBool, NcclType::kUint8, 1, kAndOr, false},
    {DType::kInt8, NcclType::kInt8, 1, kArithmetic, false},
    {DType::kInt16, NcclType::kNone, 1, kNoReductions, false},  // no 16-bit integer type in NCCL
    {DType::kInt32, NcclType::kInt32, 1, kArithmetic, false},
    {DType::kInt64, NcclType::kInt64, 1, kArithmetic, false},
    {DType::kUInt8, NcclType::kUint8, 1, kArithmetic, false},
    {DType::kUInt16, NcclType::kNone, 1, kNoReductions, false},
    {DType::kUInt32, NcclType::kUint32, 1, kArithmetic, false},
    {DType::kUInt64, NcclType::kUint64, 1, kArithmetic, false},
    // 16-bit floats: no room for order keys of their own width in NCCL (no int16), so their max/min go to MPI.
    {DType::kFloat16, NcclType::kFloat16, 1, kFloat, false},
    {DType::kBFloat16, NcclType::kBfloat16, 1, kFloat, false},
    {DType::kFloat32, NcclType::kFloat32, 1, kFloat, true},
    {DType::kFloat64, NcclType::kFloat64, 1, kFloat, true},
    {DType::kComplex64, NcclType::kFloat32, 2, kSumOnly, false},
    {DType::kComplex128, NcclType::kFloat64, 2, kSumOnly, false},
};
constexpr bool in_dtype_order() {
  for (std::size_t i = 0; i < std::size(kNcclTypes); ++i)
    if (static_cast<std::size_t>(kNcclTypes[i].dtype) != i) return false;
  return true;
}
static_assert(std::size(kNcclTypes) == kAllDTypes.size() && in_dtype_order(),
              "kNcclTypes needs one row per DType, in DType order");

const NcclTypeRow* row_of(DType d) noexcept {
  const auto i = static_cast<std::size_t>(d);
  return i < std::size(kNcclTypes) ? &kNcclTypes[i] : nullptr;
}

bool is_min_max(ReduceOp op) noexcept { return op == ReduceOp::kMin || op == ReduceOp::kMax; }

bool reduces(OpKind kind) noexcept {
  return kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
}

}  // namespace

NcclReduction nccl_reduction(ReduceOp op, DType dtype) noexcept {
  const NcclTypeRow* row = row_of(dtype);
  const auto i = static_cast<std::size_t>(op);
  if (!row || i >= row->ops.size() || row->type == NcclType::kNone || !reduce_op_supports(op, dtype)) return {};
  if (row->min_max_by_keys && is_min_max(op)) {
    const NcclTypeRow* key = row_of(order_key_dtype(dtype));
    return {key->type, key->ops[i], 1, true};
  }
  if (row->ops[i] == NcclOp::kNone) return {};
  return {row->type, row->ops[i], row->lanes, false};
}

std::string nccl_refusal(OpKind kind, ReduceOp op, DType dtype) {
  const char* name = reduce_op_name(op);
  if (!reduce_op_supports(op, dtype)) return concat("reduction '", name, "' is not defined for dtype ", dtype);
  const NcclTypeRow* row = row_of(dtype);
  if (!row || row->type == NcclType::kNone)
    return concat("NCCL cannot reduce dtype ", dtype, " (no ", dtype, " type in NCCL); use the MPI backend");
  if (nccl_reduction(op, dtype).by_order_keys)
    return concat("NCCL's float ", name, " drops NaN: the NCCL backend runs ", name, " of ", dtype,
                  " over order keys in allreduce only (not ", op_name(kind), "); use the MPI backend");
  std::string offered;
  for (int r = 0; r < kReduceOpCount; ++r)
    if (nccl_reduction(static_cast<ReduceOp>(r), dtype).type != NcclType::kNone)
      offered += concat(offered.empty() ? "" : ", ", reduce_op_name(static_cast<ReduceOp>(r)));
  const char* why = is_floating(dtype) && is_min_max(op) ? ": NCCL's float max/min drop NaN" : "";
  return concat("NCCL reduces ", dtype, " only with ", offered, " (got '", name, "'", why, "); use the MPI backend");
}

bool nccl_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept {
  switch (op) {
    case OpKind::kScan:     // NCCL has no prefix reduction
    case OpKind::kBarrier:  // nor a barrier (and a barrier moves no GPU data)
      return false;
    default: break;
  }
  if (!reduces(op)) return true;  // data movement is done on bytes: every dtype
  const NcclReduction r = nccl_reduction(reduce, dtype);
  // Order keys are made in the result buffer: allreduce only (reduce has none off the root, reduce_scatter too little);
  // the others go to MPI through pinned staging.
  return r.type != NcclType::kNone && (!r.by_order_keys || op == OpKind::kAllreduce);
}

}  // namespace shardkit::detail
