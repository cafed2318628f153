#include "backends/mpi/mpi_types.hpp"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>

#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {
namespace {

// ---- float16 / bfloat16 reductions ------------------------------------------------------------------------------

// Both 16-bit formats widen exactly to float (to_double's value is a float's).
template <typename T>
float widen(T v) {
  return static_cast<float>(to_double(v));
}
template <typename T>
T narrow(float f) {
  if constexpr (std::is_same_v<T, Half>)
    return float_to_half(f);
  else
    return float_to_bfloat16(f);
}

template <typename T, typename F>
void combine(void* in, void* inout, int* len, F f) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = narrow<T>(f(widen(a[i]), widen(b[i])));
}

template <typename T>
void sum_fn(void* in, void* inout, int* len, MPI_Datatype*) { combine<T>(in, inout, len, [](float a, float b) { return a + b; }); }
template <typename T>
void prod_fn(void* in, void* inout, int* len, MPI_Datatype*) { combine<T>(in, inout, len, [](float a, float b) { return a * b; }); }
template <typename T>
void min_fn(void* in, void* inout, int* len, MPI_Datatype*) { combine<T>(in, inout, len, nan_min<float>); }
template <typename T>
void max_fn(void* in, void* inout, int* len, MPI_Datatype*) { combine<T>(in, inout, len, nan_max<float>); }

struct HalfTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op f16_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op bf16_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

// Created once, after MPI_Init; released by MPI_Finalize with everything else.
const HalfTypes& half_types() {
  static std::once_flag once;
  static HalfTypes t;
  std::call_once(once, [] {
    SHARDKIT_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.f16));
    SHARDKIT_MPI_CHECK(MPI_Type_commit(&t.f16));
    SHARDKIT_MPI_CHECK(MPI_Type_set_name(t.f16, "shardkit_float16"));
    SHARDKIT_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16));
    SHARDKIT_MPI_CHECK(MPI_Type_commit(&t.bf16));
    SHARDKIT_MPI_CHECK(MPI_Type_set_name(t.bf16, "shardkit_bfloat16"));
    MPI_User_function* f16_fns[4] = {sum_fn<Half>, prod_fn<Half>, min_fn<Half>, max_fn<Half>};
    MPI_User_function* bf16_fns[4] = {sum_fn<BFloat16>, prod_fn<BFloat16>, min_fn<BFloat16>, max_fn<BFloat16>};
    for (int i = 0; i < 4; ++i) {
      SHARDKIT_MPI_CHECK(MPI_Op_create(f16_fns[i], /*commute=*/1, &t.f16_ops[i]));
      SHARDKIT_MPI_CHECK(MPI_Op_create(bf16_fns[i], /*commute=*/1, &t.bf16_ops[i]));
    }
  });
  return t;
}

// ---- shardkit's own reductions on types MPI has -----------------------------------------------------------------

template <typename T, T (*Fn)(T, T)>
void elementwise(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Fn(a[i], b[i]);
}

template <typename T>
T wrapping_add(T a, T b) {
  return static_cast<T>(a + b);  // modular since C++20
}

// - 8- and 16-bit integer sums: Open MPI 4.1's op/avx component adds them with saturating instructions from 16
//   elements on (200 + 200 as uint8 gives 255), a bug its developers will not fix (open-mpi/ompi#8045). These sums
//   wrap, as C's, NumPy's and NCCL's do, in every MPI library.
// - float32/float64 min and max: NaN propagates (nan_min, nan_max).
struct OwnOps {
  MPI_Op int8_sum = MPI_OP_NULL, uint8_sum = MPI_OP_NULL, int16_sum = MPI_OP_NULL, uint16_sum = MPI_OP_NULL;
  MPI_Op f32_min = MPI_OP_NULL, f32_max = MPI_OP_NULL, f64_min = MPI_OP_NULL, f64_max = MPI_OP_NULL;
};

const OwnOps& own_ops() {
  static std::once_flag once;
  static OwnOps t;
  std::call_once(once, [] {
    const std::pair<MPI_User_function*, MPI_Op*> ops[] = {
        {elementwise<std::int8_t, wrapping_add<std::int8_t>>, &t.int8_sum},
        {elementwise<std::uint8_t, wrapping_add<std::uint8_t>>, &t.uint8_sum},
        {elementwise<std::int16_t, wrapping_add<std::int16_t>>, &t.int16_sum},
        {elementwise<std::uint16_t, wrapping_add<std::uint16_t>>, &t.uint16_sum},
        {elementwise<float, nan_min<float>>, &t.f32_min},
        {elementwise<float, nan_max<float>>, &t.f32_max},
        {elementwise<double, nan_min<double>>, &t.f64_min},
        {elementwise<double, nan_max<double>>, &t.f64_max},
    };
    for (const auto& [fn, op] : ops) SHARDKIT_MPI_CHECK(MPI_Op_create(fn, /*commute=*/1, op));
  });
  return t;
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::kBool: return MPI_C_BOOL;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kUInt16: return MPI_UINT16_T;
    case DType::kUInt32: return MPI_UINT32_T;
    case DType::kUInt64: return MPI_UINT64_T;
    case DType::kFloat16: return half_types().f16;
    case DType::kBFloat16: return half_types().bf16;
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kComplex64: return MPI_C_FLOAT_COMPLEX;
    case DType::kComplex128: break;
  }
  return MPI_C_DOUBLE_COMPLEX;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (!reduce_op_supports(op, dtype))
    throw InvalidArgument(concat("reduction '", reduce_op_name(op), "' is not defined for dtype ", dtype));
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    const HalfTypes& t = half_types();
    const MPI_Op* ops = dtype == DType::kFloat16 ? t.f16_ops : t.bf16_ops;
    return ops[static_cast<int>(op)];  // sum, prod, min, max are the first four ReduceOps
  }
  if ((op == ReduceOp::kMin || op == ReduceOp::kMax) && (dtype == DType::kFloat32 || dtype == DType::kFloat64)) {
    const OwnOps& t = own_ops();
    if (dtype == DType::kFloat32) return op == ReduceOp::kMin ? t.f32_min : t.f32_max;
    return op == ReduceOp::kMin ? t.f64_min : t.f64_max;
  }
  if (op == ReduceOp::kSum) {
    switch (dtype) {
      case DType::kInt8: return own_ops().int8_sum;
      case DType::kUInt8: return own_ops().uint8_sum;
      case DType::kInt16: return own_ops().int16_sum;
      case DType::kUInt16: return own_ops().uint16_sum;
      default: break;
    }
  }
  const bool is_bool = dtype == DType::kBool;
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kLogicalAnd: return MPI_LAND;
    case ReduceOp::kLogicalOr: return MPI_LOR;
    case ReduceOp::kLogicalXor: return MPI_LXOR;
    // On bool, bitwise and logical agree (MPI defines only the logical ones for C bool).
    case ReduceOp::kBitAnd: return is_bool ? MPI_LAND : MPI_BAND;
    case ReduceOp::kBitOr: return is_bool ? MPI_LOR : MPI_BOR;
    case ReduceOp::kBitXor: break;
  }
  return is_bool ? MPI_LXOR : MPI_BXOR;
}

}  // namespace shardkit::detail
