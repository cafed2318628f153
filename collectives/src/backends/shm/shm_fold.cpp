#include "backends/shm/shm_fold.hpp"

#include <array>
#include <cstring>
#include <type_traits>

#include "backends/mpi/mpi_types.hpp"

namespace shardkit::detail {
namespace {

// One element: out[i] = in[i] op acc[i] (unaligned loads and store).
template <typename T, typename Op>
void fold_at(const unsigned char* in, const unsigned char* acc, unsigned char* out, std::int64_t i) {
  T a, b;
  std::memcpy(&a, in + i * sizeof(T), sizeof(T));
  std::memcpy(&b, acc + i * sizeof(T), sizeof(T));
  b = Op{}(a, b);
  std::memcpy(out + i * sizeof(T), &b, sizeof(T));
}
// The loops over buffers that do not overlap (`out` is `acc` itself or apart from both, as ShmFold promises): with the
// pointers declared so, they are vectorised without run-time overlap checks. (Without, the in-place call, out == acc,
// failed GCC's check and ran the scalar loop: float64 sums at 4 KiB took twice MPI_Reduce_local's time.)
template <typename T, typename Op>
void fold_apart(const unsigned char* __restrict in, const unsigned char* __restrict acc, unsigned char* __restrict out,
                std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) fold_at<T, Op>(in, acc, out, i);
}
template <typename T, typename Op>
void fold_in_place(const unsigned char* __restrict in, unsigned char* __restrict inout, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) fold_at<T, Op>(in, inout, inout, i);
}
template <typename T, typename Op>
void fold(const unsigned char* in, const unsigned char* acc, unsigned char* out, std::int64_t count) {
  if (out == acc)
    fold_in_place<T, Op>(in, out, count);
  else
    fold_apart<T, Op>(in, acc, out, count);
}

// Each operator takes (in, inout). Integer sums and products wrap (computed unsigned, where overflow is defined, at
// least as wide as int); float sums and products as Open MPI's base ops, `inout += in` (the operand order decides which
// NaN payload survives); float min and max as the MPI backend's own ops.
template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
struct Sum {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    else
      return b + a;
  }
};
struct Prod {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    else
      return b * a;
  }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return std::min(a, b);
    else
      return nan_min(a, b);
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return std::max(a, b);
    else
      return nan_max(a, b);
  }
};
struct BitAnd {
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a & b); }
};
struct BitOr {
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a | b); }
};
struct BitXor {
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};

template <typename T>
ShmFold fold_for(ReduceOp op) noexcept {
  constexpr bool integer = std::is_integral_v<T>;
  switch (op) {
    case ReduceOp::kSum: return fold<T, Sum>;
    case ReduceOp::kProd: return fold<T, Prod>;
    case ReduceOp::kMin: return fold<T, Min>;
    case ReduceOp::kMax: return fold<T, Max>;
    default: break;
  }
  if constexpr (integer) {
    switch (op) {
      case ReduceOp::kBitAnd: return fold<T, BitAnd>;
      case ReduceOp::kBitOr: return fold<T, BitOr>;
      case ReduceOp::kBitXor: return fold<T, BitXor>;
      default: break;
    }
  }
  return nullptr;
}

// Looked up on every reduction: a table, filled at load time.
using FoldRow = std::array<ShmFold, kReduceOpCount>;
using FoldTable = std::array<FoldRow, kAllDTypes.size()>;

FoldTable make_fold_table() {
  FoldTable t{};
  for (DType d : kAllDTypes)
    for (int o = 0; o < kReduceOpCount; ++o) {
      const auto r = static_cast<ReduceOp>(o);
      if (!reduce_op_supports(r, d)) continue;
      t[static_cast<std::size_t>(d)][o] = visit_dtype(d, [r](auto v) -> ShmFold {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, bool> || !std::is_arithmetic_v<T>)
          return nullptr;  // bool, float16/bfloat16 (Half, BFloat16 are classes), complex
        else
          return fold_for<T>(r);
      });
    }
  return t;
}

const FoldTable kFolds = make_fold_table();

}  // namespace

ShmFold shm_fold(DType dtype, ReduceOp op) noexcept {
  return kFolds[static_cast<std::size_t>(dtype)][static_cast<std::size_t>(op)];
}

}  // namespace shardkit::detail
