// The NCCL backend's reduction table (collectives/src/backends/nccl/nccl_caps.cpp), in every build: for every operation ×
// dtype × reduction, nccl_supports (what the router reads) answers as the rules written out here (NCCL's
// documentation and docs/cpp.md, not read from the code under test), and agrees with the mapping the backend calls
// NCCL with: a supported reduction has an NCCL type and op whose width covers the dtype; a refused one has a message.

#include <string>

#include "backend.hpp"
#include "collective_test_util.hpp"
#include "backends/nccl/nccl_caps.hpp"
#include "backends/nccl/nccl_backend.hpp"

namespace shardkit::testing {
namespace {

using detail::NcclOp;
using detail::NcclType;

constexpr OpKind kReducing[] = {OpKind::kAllreduce, OpKind::kReduce, OpKind::kReduceScatter};

bool is_min_max(ReduceOp r) { return r == ReduceOp::kMin || r == ReduceOp::kMax; }

// What the NCCL backend reduces: NCCL has no 16-bit integers, no complex (sum as pairs of reals), no bool (and/or as
// uint8 min/max), no logical or bitwise reductions; its float max/min drop NaN, so only float32/float64 allreduce
// max/min run there (over order keys).
bool expected(OpKind kind, DType d, ReduceOp r) {
  if (!reduce_op_supports(r, d)) return false;
  switch (d) {
    case DType::kInt16:
    case DType::kUInt16: return false;
    case DType::kBool:
      return r == ReduceOp::kLogicalAnd || r == ReduceOp::kLogicalOr || r == ReduceOp::kBitAnd ||
             r == ReduceOp::kBitOr;
    case DType::kComplex64:
    case DType::kComplex128: return r == ReduceOp::kSum;
    default: break;
  }
  const bool arithmetic = r == ReduceOp::kSum || r == ReduceOp::kProd || is_min_max(r);
  if (is_floating(d) && is_min_max(r))
    return kind == OpKind::kAllreduce && (d == DType::kFloat32 || d == DType::kFloat64);
  return arithmetic;
}

// The NCCL reduction of a supported pair: bool as uint8 0/1 (and is min, or is max), the others by name.
NcclOp expected_op(DType d, ReduceOp r) {
  if (d == DType::kBool) return r == ReduceOp::kLogicalAnd || r == ReduceOp::kBitAnd ? NcclOp::kMin : NcclOp::kMax;
  switch (r) {
    case ReduceOp::kSum: return NcclOp::kSum;
    case ReduceOp::kProd: return NcclOp::kProd;
    case ReduceOp::kMin: return NcclOp::kMin;
    case ReduceOp::kMax: return NcclOp::kMax;
    default: break;
  }
  return NcclOp::kNone;
}

// Bytes of one element of an NCCL type.
std::size_t nccl_size(NcclType t) {
  switch (t) {
    case NcclType::kInt8:
    case NcclType::kUint8: return 1;
    case NcclType::kFloat16:
    case NcclType::kBfloat16: return 2;
    case NcclType::kInt32:
    case NcclType::kUint32:
    case NcclType::kFloat32: return 4;
    case NcclType::kInt64:
    case NcclType::kUint64:
    case NcclType::kFloat64: return 8;
    case NcclType::kNone: break;
  }
  return 0;
}

TEST(NcclCaps, EveryReductionAgreesWithTheTable) {
  for (OpKind kind : kReducing)
    for (DType d : kAllDTypes)
      for (int i = 0; i < kReduceOpCount; ++i) {
        const auto r = static_cast<ReduceOp>(i);
        SCOPED_TRACE(::testing::Message() << op_name(kind) << " " << d << " " << reduce_op_name(r));
        const bool supported = detail::nccl_supports(kind, d, r);
        EXPECT_EQ(supported, expected(kind, d, r));
        const detail::NcclReduction m = detail::nccl_reduction(r, d);
        if (supported) {
          ASSERT_NE(m.type, NcclType::kNone);
          EXPECT_EQ(nccl_size(m.type) * static_cast<std::size_t>(m.lanes), dtype_size(d));
          EXPECT_EQ(m.lanes, is_complex(d) ? 2 : 1);
          EXPECT_EQ(m.by_order_keys, is_floating(d) && is_min_max(r));
          EXPECT_EQ(m.op, expected_op(d, r));
        } else {
          const std::string why = detail::nccl_refusal(kind, r, d);
          EXPECT_NE(why.find(reduce_op_supports(r, d) ? "MPI backend" : "not defined"), std::string::npos) << why;
          EXPECT_NE(why.find(dtype_name(d)), std::string::npos) << why;
        }
      }
}

TEST(NcclCaps, DataMovementOnEveryDtypeNoScanOrBarrier) {
  for (int k = 0; k < kOpCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter) continue;
    for (DType d : kAllDTypes)
      EXPECT_EQ(detail::nccl_supports(kind, d, ReduceOp::kSum), kind != OpKind::kScan && kind != OpKind::kBarrier)
          << op_name(kind) << " " << d;
  }
}

TEST(NcclCaps, RefusalsSayWhy) {
  EXPECT_EQ(detail::nccl_refusal(OpKind::kAllreduce, ReduceOp::kLogicalXor, DType::kBool),
            "NCCL reduces bool only with land, lor, band, bor (got 'lxor'); use the MPI backend");
  EXPECT_EQ(detail::nccl_refusal(OpKind::kAllreduce, ReduceOp::kProd, DType::kComplex64),
            "NCCL reduces complex64 only with sum (got 'prod'); use the MPI backend");
  EXPECT_EQ(detail::nccl_refusal(OpKind::kAllreduce, ReduceOp::kSum, DType::kInt16),
            "NCCL cannot reduce dtype int16 (no int16 type in NCCL); use the MPI backend");
  EXPECT_EQ(detail::nccl_refusal(OpKind::kAllreduce, ReduceOp::kMax, DType::kComplex64),
            "reduction 'max' is not defined for dtype complex64");
  const std::string keys = detail::nccl_refusal(OpKind::kReduce, ReduceOp::kMax, DType::kFloat32);
  EXPECT_NE(keys.find("allreduce only (not reduce)"), std::string::npos) << keys;
  const std::string half = detail::nccl_refusal(OpKind::kAllreduce, ReduceOp::kMin, DType::kFloat16);
  EXPECT_NE(half.find("drop NaN"), std::string::npos) << half;
}

}  // namespace
}  // namespace shardkit::testing
