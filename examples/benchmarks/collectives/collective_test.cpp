// What every collective's entry shares: the table of entries, buffer layouts, inputs, the raw MPI types and the
// result comparison.

#include <algorithm>
#include <complex>
#include <type_traits>
#include <utility>

#include "bench.hpp"

namespace shardkit::bench {

std::span<const CollectiveTest* const> all_collectives() {
  static const CollectiveTest* const kAll[] = {&kAllreduceTest, &kAllgatherTest, &kReduceScatterTest, &kBcastTest,
                                               &kReduceTest,    &kGatherTest,    &kScatterTest,       &kAlltoallTest,
                                               &kSendrecvTest,  &kScanTest,      &kBarrierTest};
  return kAll;
}

Layout whole_message(std::int64_t count, std::int64_t, int) {
  return {count, count, count, 0};
}

double share_factor(int ranks) {
  return static_cast<double>(ranks - 1) / ranks;
}

double unit_factor(int) {
  return 1.0;
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
  const std::pair<DType, MPI_Datatype> kTypes[] = {{DType::kInt8, MPI_INT8_T},
                                                   {DType::kInt16, MPI_INT16_T},
                                                   {DType::kInt32, MPI_INT32_T},
                                                   {DType::kInt64, MPI_INT64_T},
                                                   {DType::kUInt8, MPI_UINT8_T},
                                                   {DType::kUInt16, MPI_UINT16_T},
                                                   {DType::kUInt32, MPI_UINT32_T},
                                                   {DType::kUInt64, MPI_UINT64_T},
                                                   {DType::kFloat32, MPI_FLOAT},
                                                   {DType::kFloat64, MPI_DOUBLE},
                                                   {DType::kComplex64, MPI_C_FLOAT_COMPLEX},
                                                   {DType::kComplex128, MPI_C_DOUBLE_COMPLEX}};
  for (const auto& [dtype, type] : kTypes)
    if (dtype == d) return type;
  return std::nullopt;
}

MPI_Op raw_op(ReduceOp op) {
  const std::pair<ReduceOp, MPI_Op> kOps[] = {
      {ReduceOp::kSum, MPI_SUM}, {ReduceOp::kProd, MPI_PROD}, {ReduceOp::kMin, MPI_MIN}, {ReduceOp::kMax, MPI_MAX}};
  for (const auto& [r, mpi] : kOps)
    if (r == op) return mpi;
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
