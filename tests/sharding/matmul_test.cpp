// Distributed matmul: every algorithm at every world size and test mesh, non-square and odd sizes, float32 and
// float64, against a one-rank BLAS reference; uneven shards where the algorithm takes them, a clear error where not.

#include <numeric>
#include <tuple>

#include "shardkit/core/gemm.hpp"
#include "sharding_test_util.hpp"

namespace shardkit::testing {
namespace {

// Small integers: every product and sum is exact in float32 and float64.
Array ints(Shape shape, int salt, DType dtype) {
  Array a = Array::empty(shape, DType::kFloat64);
  auto* p = a.data_as<double>();
  for (std::int64_t i = 0; i < a.numel(); ++i) p[i] = static_cast<double>((i * 7 + salt * 3) % 11) - 5.0;
  if (dtype == DType::kFloat64) return a;
  Array out = Array::empty(shape, dtype);
  for (std::int64_t i = 0; i < a.numel(); ++i) out.data_as<float>()[i] = static_cast<float>(p[i]);
  return out;
}

Array reference(const Array& a, const Array& b) {
  Array c = Array::empty({a.dim(0), b.dim(1)}, a.dtype());
  gemm(a, b, c);
  return c;
}

struct Case {
  MatmulAlgorithm alg;
  std::int64_t m, k, n;
};

// Dimensions that fit each algorithm on a mesh of `p` ranks (p | M, K for the rings; SUMMA: px | M, py | N,
// lcm | K), with odd and non-square factors.
std::vector<Case> cases(const Mesh& mesh) {
  const std::int64_t p = mesh.size();
  std::vector<Case> out = {
      {MatmulAlgorithm::kLocal, 3 * p, 5, 7},
      {MatmulAlgorithm::kLocal, 1, 1, 1},
      {MatmulAlgorithm::kAllGather, 3 * p, 5 * p, 7},
      {MatmulAlgorithm::kAllGather, p, p, 1},
      {MatmulAlgorithm::kReduceScatter, 5 * p, 3 * p, 9},
      {MatmulAlgorithm::kReduceScatter, p, p, 2},
  };
  if (mesh.ndim() == 2) {
    const std::int64_t px = mesh.shape()[0], py = mesh.shape()[1];
    out.push_back({MatmulAlgorithm::kSumma, 3 * px, 5 * std::lcm(px, py), 7 * py});
    out.push_back({MatmulAlgorithm::kSumma, px, std::lcm(px, py), py});
  }
  return out;
}

TEST(Matmul, EveryAlgorithmMatchesTheReference) {
  for (const Mesh& mesh : test_meshes()) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      for (const Case& c : cases(mesh)) {
        for (bool overlap : {true, false}) {
          SCOPED_TRACE(mesh.to_string() + " " + matmul_algorithm_name(c.alg) + " " + std::string(dtype_name(dtype)) +
                       " M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n) +
                       (overlap ? " overlap" : " no-overlap"));
          const Array a = ints({c.m, c.k}, 1, dtype), b = ints({c.k, c.n}, 2, dtype);
          // Operands start replicated: the algorithm reshards them to its layout.
          ShardedArray sa = distribute(a, NamedSharding(mesh, P()));
          ShardedArray sb = distribute(b, NamedSharding(mesh, P()));
          ShardedArray sc = matmul(sa, sb, MatmulOptions{c.alg, overlap});
          EXPECT_EQ(sc.shape(), (Shape{c.m, c.n}));
          EXPECT_TRUE(equal(process_allgather(sc), reference(a, b)));
        }
      }
    }
  }
}

TEST(Matmul, InputsAreNeverWrittenAndRepeatsAgree) {
  // The operands in each algorithm's own layout, multiplied twice: the second product must equal the first (an
  // algorithm that reused an operand's memory as a buffer would corrupt it), and the operands must be unchanged.
  for (const Mesh& mesh : test_meshes()) {
    const std::int64_t p = mesh.size();
    const Axes all(mesh.axis_names());
    const Array a = ints({4 * p, 6 * p}, 7, DType::kFloat64), b = ints({6 * p, 4 * p}, 8, DType::kFloat64);
    const Array want = reference(a, b);
    std::vector<std::tuple<MatmulAlgorithm, PartitionSpec, PartitionSpec>> layouts = {
        {MatmulAlgorithm::kLocal, P(all, kNone), P()},
        {MatmulAlgorithm::kAllGather, P(all, kNone), P(all, kNone)},
        {MatmulAlgorithm::kReduceScatter, P(kNone, all), P(all, kNone)}};
    if (mesh.ndim() == 2) {
      const auto& n = mesh.axis_names();
      layouts.emplace_back(MatmulAlgorithm::kSumma, P(n[0], n[1]), P(n[0], n[1]));
    }
    for (const auto& [alg, sa, sb] : layouts) {
      SCOPED_TRACE(mesh.to_string() + " " + matmul_algorithm_name(alg));
      ShardedArray xa = distribute(a, NamedSharding(mesh, sa)), xb = distribute(b, NamedSharding(mesh, sb));
      const Array a_block = xa.local().clone(), b_block = xb.local().clone();
      for (int rep = 0; rep < 2; ++rep)
        EXPECT_TRUE(equal(process_allgather(matmul(xa, xb, MatmulOptions{alg})), want)) << "repeat " << rep;
      EXPECT_TRUE(equal(xa.local(), a_block));
      EXPECT_TRUE(equal(xb.local(), b_block));
    }
  }
}

TEST(Matmul, AutoPicksFromTheShardings) {
  for (const Mesh& mesh : test_meshes()) {
    const Axes all(mesh.axis_names());
    const std::int64_t p = mesh.size();
    // N = 4p so that SUMMA's column split divides too.
    const Array a = ints({4 * p, 6 * p}, 3, DType::kFloat64), b = ints({6 * p, 4 * p}, 4, DType::kFloat64);
    const Array want = reference(a, b);
    auto run = [&](const PartitionSpec& sa, const PartitionSpec& sb, MatmulAlgorithm expected) {
      ShardedArray xa = distribute(a, NamedSharding(mesh, sa)), xb = distribute(b, NamedSharding(mesh, sb));
      EXPECT_EQ(choose_matmul_algorithm(xa, xb), expected) << sa.to_string() << " @ " << sb.to_string();
      EXPECT_TRUE(equal(process_allgather(matmul(xa, xb)), want)) << sa.to_string() << " @ " << sb.to_string();
    };
    run(P(all, kNone), P(), MatmulAlgorithm::kLocal);
    run(P(all, kNone), P(all, kNone), MatmulAlgorithm::kAllGather);
    run(P(kNone, all), P(all, kNone), MatmulAlgorithm::kReduceScatter);
    run(P(kNone, all), P(kNone, all), MatmulAlgorithm::kLocal);  // anything else: resharded, then local
    if (mesh.ndim() == 2) {
      const auto& n = mesh.axis_names();
      // SUMMA needs K = 6p to divide by lcm(px, py), which it does for every test mesh.
      run(P(n[0], n[1]), P(n[0], n[1]), MatmulAlgorithm::kSumma);
    }
  }
}

TEST(Matmul, LocalTakesUnevenRowsOthersRefuseClearly) {
  for (const Mesh& mesh : test_meshes()) {
    const std::int64_t p = mesh.size();
    const Axes all(mesh.axis_names());
    const Array a = ints({2 * p + 1, 3}, 5, DType::kFloat64), b = ints({3, 4}, 6, DType::kFloat64);
    ShardedArray sa = distribute(a, NamedSharding(mesh, P(all, kNone), /*uneven=*/true));
    ShardedArray sb = distribute(b, NamedSharding(mesh, P()));
    ShardedArray c = matmul(sa, sb);
    EXPECT_TRUE(c.sharding().uneven());
    EXPECT_TRUE(equal(process_allgather(c), reference(a, b)));
    if (p > 1) {
      try {
        matmul(distribute(a, NamedSharding(mesh, P())), sb, MatmulOptions{MatmulAlgorithm::kAllGather});
        ADD_FAILURE() << "no error";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("must divide by"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Matmul, BadOperands) {
  const Mesh& mesh = test_meshes().front();
  ShardedArray a = distribute(ints({4, 3}, 1, DType::kFloat64), NamedSharding(mesh, P()));
  ShardedArray b = distribute(ints({4, 3}, 1, DType::kFloat64), NamedSharding(mesh, P()));
  EXPECT_THROW(matmul(a, b), InvalidArgument);  // inner dimensions differ
  ShardedArray f = distribute(ints({3, 2}, 1, DType::kFloat32), NamedSharding(mesh, P()));
  EXPECT_THROW(matmul(a, f), InvalidArgument);  // dtypes differ
  ShardedArray v = distribute(ints({3}, 1, DType::kFloat64), NamedSharding(mesh, P()));
  EXPECT_THROW(matmul(a, v), InvalidArgument);  // not 2-d
  EXPECT_THROW(parse_matmul_algorithm("strassen"), InvalidArgument);
  if (mesh.ndim() == 1) {
    EXPECT_THROW(matmul(a, distribute(ints({3, 2}, 1, DType::kFloat64), NamedSharding(mesh, P())),
                        MatmulOptions{MatmulAlgorithm::kSumma}),
                 InvalidArgument);  // SUMMA needs a 2-d mesh
  }
}

}  // namespace
}  // namespace shardkit::testing
