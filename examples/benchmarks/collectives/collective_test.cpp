// What every collective's entry shares: the table of entries, buffer layouts, inputs, the raw MPI types and the
// result comparison.

#include <algorithm>
#include <complex>
#include <type_traits>

#include "bench.hpp"

namespace shardkit::bench {

std::span<const CollectiveTest* const> all_collectives() {
  static const CollectiveTest* const kAll[] = {&kAllreduceTest, &kAllgatherTest, &kReduceScatterTest,
                                               &kBcastTest,     &kAlltoallTest,  &kSendrecvTest};
  return kAll;
}

Layout layout_for(const CollectiveTest& t, std::int64_t bytes, std::size_t itemsize, int ranks) {
  const std::int64_t count = std::max<std::int64_t>(1, bytes / static_cast<std::int64_t>(itemsize));
  const std::int64_t block = std::max<std::int64_t>(1, count / ranks);
  Layout l = t.counts(count, block, ranks);
  l.bytes = std::max(l.send_count, l.recv_count) * static_cast<std::int64_t>(itemsize);
  return l;
}

// A native MPI type: shardkit's MPI backend maps these dtypes to the same ones.
std::optional<MPI_Datatype> raw_datatype(DType d) {
  switch (d) {
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kInt16:
      return MPI_INT16_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kUInt16:
      return MPI_UINT16_T;
    case DType::kUInt32:
      return MPI_UINT32_T;
    case DType::kUInt64:
      return MPI_UINT64_T;
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kComplex64:
      return MPI_C_FLOAT_COMPLEX;
    case DType::kComplex128:
      return MPI_C_DOUBLE_COMPLEX;
    default:
      break;
  }
  return std::nullopt;
}

MPI_Op raw_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    default:
      break;
  }
  return MPI_SUM;
}

namespace {

template <typename T>
constexpr bool kNumeric = std::is_arithmetic_v<T>;
template <typename T>
constexpr bool kNumeric<std::complex<T>> = true;

}  // namespace

// Small integers (+-1 and +-2 for prod; integer overflow wraps alike on both sides): exact in every dtype and order.
void fill_inputs(Array& a, int rank, ReduceOp redop) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kNumeric<T>) {
      static constexpr int kProdValues[] = {1, 2, -1, -2};
      T* p = static_cast<T*>(a.data());
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        const int v = redop == ReduceOp::kProd ? kProdValues[(i + rank) % 4]
                                               : static_cast<int>((i * 7 + std::int64_t{rank} * 13) % 17) - 8;
        p[i] = static_cast<T>(v);
      }
    }
  });
}

std::int64_t count_wrong(const Bench& b, const std::vector<unsigned char>& got, const Array& out) {
  const auto* bytes = static_cast<const unsigned char*>(out.data());
  std::int64_t wrong = 0;
  const std::size_t item = out.itemsize();
  for (std::int64_t i = 0; i < out.numel(); ++i)
    if (std::memcmp(got.data() + i * item, bytes + i * item, item) != 0) ++wrong;
  std::int64_t total = 0;
  SHARDKIT_MPI_CHECK(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, b.control));
  return total;
}

}  // namespace shardkit::bench
