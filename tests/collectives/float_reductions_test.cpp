// How floating-point reductions round and treat NaN, on every backend the test buffers route to (host buffers: MPI;
// the GPU suite: NCCL where it declares the reduction):
//  - float16/bfloat16 sums and products round the exact result to nearest, ties to even: inputs whose exact result
//    lies between two 16-bit values (or halfway), held by two ranks at every pair of positions (the others hold the
//    identity, so that the order of reduction cannot matter), against a rounding written here from frexp/nearbyint;
//  - a NaN held by any one rank (at every position), or by all, makes max, min, sum and prod NaN, in every float dtype
//    (docs/cpp.md, "NaN and rounding"), as NumPy's maximum/minimum and JAX's pmax/pmin do.

#include <cmath>
#include <utility>

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

// x rounded to a binary format with `digits` significand bits (11: float16, 8: bfloat16), to nearest with ties to
// even (nearbyint in the default rounding mode). For the normal range, which the cases below stay in.
double round_to(double x, int digits) {
  if (x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // x = m * 2^e with 0.5 <= |m| < 1
  const double ulp = std::ldexp(1.0, e - digits);
  return std::nearbyint(x / ulp) * ulp;
}

struct HalfCase {
  ReduceOp op;
  double a, b;  // rounded to the dtype first; the exact a (op) b is then rounded once
};

// Sums and products whose exact result lies strictly between two neighbours (rounding toward zero gives the lower one)
// or exactly halfway (ties go to the even neighbour, not up); positive and negative.
const std::vector<HalfCase>& half_cases(DType dt) {
  static const std::vector<HalfCase> f16 = {
      {ReduceOp::kSum, 2.0, 3 * 0x1p-11},           // 2.00146: 2.00195, not 2.0
      {ReduceOp::kSum, 2.0, 0x1p-10},               // halfway: ties to even 2.0
      {ReduceOp::kSum, 2.001953125, 0x1p-10},       // halfway: ties to even 2.00390625
      {ReduceOp::kSum, -2.0, -3 * 0x1p-11},         // -2.00195
      {ReduceOp::kSum, 1000.0, 0.3},                // 1000.3 (ulp 0.5): 1000.5
      {ReduceOp::kProd, 0.7, 1.9},                  // 1.33064: 1.33105, not 1.33008
      {ReduceOp::kProd, 1.0 + 3 * 0x1p-10, 1.5},    // 1.50439: halfway, ties to even 1.50391
      {ReduceOp::kProd, 3.0, 1.0 + 0x1p-10},        // 3.00293 (ulp 2^-9): halfway, ties to even 3.00391
  };
  static const std::vector<HalfCase> bf16 = {
      {ReduceOp::kSum, 0.1, 0.2},                   // 0.30029: 0.30078, not 0.29883
      {ReduceOp::kSum, 1.0, 0x1p-8},                // halfway: ties to even 1.0
      {ReduceOp::kSum, 1.0078125, 0x1p-8},          // halfway: ties to even 1.015625
      {ReduceOp::kSum, -1.0, -3 * 0x1p-9},          // -1.00781
      {ReduceOp::kProd, 0.7, 1.9},                  // 1.32742: 1.32812, not 1.32031
      {ReduceOp::kProd, 1.0 + 3 * 0x1p-7, 1.5},     // 1.53516: halfway, ties to even 1.53125
      {ReduceOp::kProd, 3.0, 1.0 + 0x1p-7},         // 3.02344 (ulp 2^-6): halfway, ties to even 3.03125
  };
  return dt == DType::kFloat16 ? f16 : bf16;
}

// Every element is one (case, pair of ranks i < j): rank i holds a, rank j holds b, the others the identity.
struct Placement {
  std::size_t c;
  int i, j;
};

std::vector<Placement> placements(std::size_t cases, int size) {
  std::vector<Placement> out;
  for (std::size_t c = 0; c < cases; ++c)
    for (int i = 0; i < size; ++i)
      for (int j = i + 1; j < size; ++j) out.push_back({c, i, j});
  return out;
}

template <typename T>
void check_half_rounding(DType dt, ReduceOp op, Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  const int digits = dt == DType::kFloat16 ? 11 : 8;
  std::vector<HalfCase> cases;
  for (const HalfCase& c : half_cases(dt))
    if (c.op == op) cases.push_back(c);
  const auto where = placements(cases.size(), size);
  const auto n = static_cast<std::int64_t>(where.size());
  const double identity = op == ReduceOp::kSum ? 0.0 : 1.0;
  auto exact = [&](double a, double b) { return op == ReduceOp::kSum ? a + b : a * b; };
  Array x = Array::empty({n}, dt);
  std::vector<double> all(n), prefix(n);  // the rounded result over all ranks, and over ranks 0..rank
  for (std::int64_t k = 0; k < n; ++k) {
    const Placement& p = where[k];
    const double a = to_double(from_double<T>(cases[p.c].a)), b = to_double(from_double<T>(cases[p.c].b));
    x.data_as<T>()[k] = from_double<T>(rank == p.i ? a : rank == p.j ? b : identity);
    all[k] = round_to(exact(a, b), digits);
    prefix[k] = rank >= p.j ? all[k] : rank >= p.i ? a : identity;
    // The case is one: between two neighbours or halfway, not already representable.
    ASSERT_NE(all[k], exact(a, b)) << "case " << p.c << " is exact in " << dt;
  }
  const Array input = x.to(buffer_device());
  auto expect = [&](const Array& got_any, const std::vector<double>& want, const char* what) {
    const Array got = got_any.to(Device::cpu());
    for (std::int64_t k = 0; k < n; ++k) {
      const Placement& p = where[k];
      EXPECT_EQ(to_double(got.data_as<T>()[k]), want[k])
          << what << " " << dt << " " << reduce_op_name(op) << " of " << cases[p.c].a << " on rank " << p.i
          << " and " << cases[p.c].b << " on rank " << p.j;
    }
  };
  expect(comm.allreduce(input, op).value, all, "allreduce");
  Array buf = input.clone();
  comm.allreduce_inplace(buf, op).wait();
  expect(buf, all, "allreduce in place");
  expect(comm.scan(input, op).value, prefix, "scan");
}

class FloatReductions : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU(); }
};

TEST(HalfRounding, SumsAndProductsRoundToNearestEven) {
  SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU();
  Communicator& c = *world();
  if (c.size() < 2) GTEST_SKIP() << "a reduction over one rank rounds nothing";
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd}) {
    check_half_rounding<Half>(DType::kFloat16, op, c);
    check_half_rounding<BFloat16>(DType::kBFloat16, op, c);
  }
}

// The communicators the NaN test runs on: the default route (by size: small host buffers take shm on one node), and
// every route forced, so that each backend's max and min are reached by every operation (on the default route an
// allreduce of a few elements never reached MPI's).
std::vector<std::shared_ptr<Communicator>>& routes() {
  static std::vector<std::shared_ptr<Communicator>> all = [] {
    std::vector<std::shared_ptr<Communicator>> c{world()};
    if (buffer_device().kind == DeviceKind::kCPU)
      for (BackendKind b : {BackendKind::kMpi, BackendKind::kShm})
        c.push_back(Communicator::world({.backend = b, .name = std::string("nan on ") + backend_name(b)}));
    return c;
  }();
  return all;
}

// Element k < size: a NaN on rank k only; element size: no NaN (rank r holds 1 + r); element size + 1: NaN everywhere.
// On the default route and each forced one.
TEST_P(FloatReductions, NaNPropagatesThroughMaxMinSumAndProdFromEveryRank) {
  for (const auto& on : routes()) {
    SCOPED_TRACE(on->name());
    Communicator& comm = *on;
    const DType dt = GetParam();
    const int rank = comm.rank(), size = comm.size();
    const std::int64_t n = size + 2;
    const double nan = std::nan("");
    auto held = [&](std::int64_t k, int r) { return k == size ? 1.0 + r : (k == r || k == size + 1) ? nan : 1.0 + r; };
    // The reduction of ranks 0..last at element k.
    auto want = [&](ReduceOp op, std::int64_t k, int last) {
      double acc = held(k, 0);
      for (int r = 1; r <= last; ++r) {
        const double v = held(k, r);
        acc = std::isnan(acc) || std::isnan(v) ? nan
              : op == ReduceOp::kSum           ? acc + v
              : op == ReduceOp::kProd          ? acc * v
              : op == ReduceOp::kMax           ? std::max(acc, v)
                                               : std::min(acc, v);
      }
      return acc;
    };
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_integral_v<T> && !kIsComplex<T>) {
        Array host = Array::empty({n}, dt), rows = Array::empty({size, n}, dt);
        for (std::int64_t k = 0; k < n; ++k) host.data_as<T>()[k] = from_double<T>(held(k, rank));
        for (int q = 0; q < size; ++q) rows.slice(0, q, q + 1).reshape({n}).copy_from(host);
        const Array x = host.to(buffer_device()), xs = rows.to(buffer_device());
        for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum, ReduceOp::kProd}) {
          auto check = [&](const Array& got_any, int last, const char* what) {
            const Array got = got_any.to(Device::cpu());
            for (std::int64_t k = 0; k < n; ++k) {
              const double g = to_double(got.data_as<T>()[k]), w = want(op, k, last);
              const std::string nan_on = k < size ? "rank " + std::to_string(k) : k == size ? "no rank" : "every rank";
              if (std::isnan(w))
                EXPECT_TRUE(std::isnan(g))
                    << what << " " << reduce_op_name(op) << " with a NaN on " << nan_on << " gave " << g;
              else
                EXPECT_EQ(g, w) << what << " " << reduce_op_name(op) << " with a NaN on " << nan_on;
            }
          };
          check(comm.allreduce(x, op).value, size - 1, "allreduce");
          Array buf = x.clone();
          comm.allreduce_inplace(buf, op).wait();
          check(buf, size - 1, "allreduce in place");
          const Array reduced = comm.reduce(x, op, size - 1).value;
          if (rank == size - 1) check(reduced, size - 1, "reduce");
          check(comm.reduce_scatter(xs, op).value, size - 1, "reduce_scatter");
          check(comm.scan(x, op).value, rank, "scan");
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Floats, FloatReductions,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace shardkit::testing
