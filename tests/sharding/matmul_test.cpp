// Distributed matmul: every algorithm at every world size and test mesh, non-square and odd sizes, float32 and
// float64, against a one-rank BLAS reference; uneven shards where the algorithm takes them, a clear error where not.

#include <sched.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

#include "shardkit/core/gemm.hpp"
#include "shardkit/launch/runtime.hpp"
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
        for (std::optional<bool> overlap : {std::optional<bool>(true), std::optional<bool>(false),
                                            std::optional<bool>()}) {
          SCOPED_TRACE(mesh.to_string() + " " + matmul_algorithm_name(c.alg) + " " + std::string(dtype_name(dtype)) +
                       " M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n) +
                       (!overlap ? " overlap by default" : *overlap ? " overlap" : " no-overlap"));
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

TEST(Matmul, OverlapByDefaultOnlyWhereACoreIsFree) {
  // Every rank needs a core beyond its BLAS threads for its transfers.
  EXPECT_FALSE(host_overlap_pays(1, 1, 1));
  EXPECT_TRUE(host_overlap_pays(2, 1, 1));
  EXPECT_FALSE(host_overlap_pays(2, 2, 1));  // 2 ranks on 2 cores: the transfers would compete with the GEMMs
  EXPECT_TRUE(host_overlap_pays(4, 2, 1));
  EXPECT_FALSE(host_overlap_pays(8, 2, 4));  // 2 x (4 + 1) = 10 > 8
  EXPECT_TRUE(host_overlap_pays(64, 8, 4));
  EXPECT_FALSE(host_overlap_pays(63, 8, 7));
  EXPECT_TRUE(host_overlap_pays(2, 0, 0));  // nonsense counts read as one rank, one thread
  EXPECT_TRUE(matmul_overlap_default(Device::cuda()));  // NCCL's stream overlaps without taking a core
  // On the host it is that formula over the cores this process may use (its affinity mask when bound to fewer than
  // the machine has, else the machine's, shared by the ranks on it) and the BLAS threads per rank.
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int mine = std::max(1, CPU_COUNT(&set));
  const int sharing = mine < machine ? 1 : Runtime::current()->local_size();
  const int saved = blas_num_threads();
  for (int threads : {1, 2, mine, mine + 1}) {
    set_blas_num_threads(threads);
    const int got = blas_num_threads();  // BLAS may cap the count
    SCOPED_TRACE("BLAS threads " + std::to_string(got) + ", cores " + std::to_string(mine) + ", ranks sharing them " +
                 std::to_string(sharing));
    EXPECT_EQ(matmul_overlap_default(Device::cpu()), host_overlap_pays(mine, sharing, got));
    if (got >= mine) {
      EXPECT_FALSE(matmul_overlap_default(Device::cpu())) << "BLAS takes every core, yet matmul overlaps";
    }
  }
  set_blas_num_threads(saved);
  if (Runtime::current()->local_size() > machine) {
    EXPECT_FALSE(matmul_overlap_default(Device::cpu())) << "more ranks than cores on this machine, yet matmul overlaps";
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

TEST(Matmul, EachLayoutIsTakenAsItIsChosenAndNamedWhenItDoesNotFit) {
  // matmul_layout, the chooser, the result's sharding and the error messages all read one table: operands in an
  // algorithm's layout are chosen for it, give C in its layout, and sizes it cannot cut are refused with a message
  // that names the algorithm, its layout and the dimension.
  const std::vector<MatmulAlgorithm> algs = {MatmulAlgorithm::kLocal, MatmulAlgorithm::kAllGather,
                                             MatmulAlgorithm::kReduceScatter, MatmulAlgorithm::kSumma};
  for (const Mesh& mesh : test_meshes()) {
    const std::int64_t p = mesh.size();
    const Array a = ints({4 * p, 6 * p}, 3, DType::kFloat64), b = ints({6 * p, 4 * p}, 4, DType::kFloat64);
    const Array want = reference(a, b);
    for (MatmulAlgorithm alg : algs) {
      SCOPED_TRACE(mesh.to_string() + " " + matmul_algorithm_name(alg));
      EXPECT_EQ(parse_matmul_algorithm(matmul_algorithm_name(alg)), alg);
      if (alg == MatmulAlgorithm::kSumma && mesh.ndim() != 2) {
        EXPECT_THROW(matmul_layout(alg, mesh), InvalidArgument);
        continue;
      }
      const MatmulLayout layout = matmul_layout(alg, mesh);
      ShardedArray xa = distribute(a, NamedSharding(mesh, layout.a)), xb = distribute(b, NamedSharding(mesh, layout.b));
      EXPECT_EQ(choose_matmul_algorithm(xa, xb), alg) << layout.a << " @ " << layout.b;
      ShardedArray c = matmul(xa, xb);
      EXPECT_EQ(c.spec(), layout.c);
      EXPECT_TRUE(equal(process_allgather(c), want));
      if (p == 1 || alg == MatmulAlgorithm::kLocal) continue;
      // 13 divides by no axis size of 2 to 4.
      const Array odd = ints({13, 13}, 5, DType::kFloat64);
      try {
        matmul(distribute(odd, NamedSharding(mesh, P())), distribute(odd, NamedSharding(mesh, P())),
               MatmulOptions{alg});
        ADD_FAILURE() << "no error";
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("matmul (") + matmul_algorithm_name(alg) + ", " + matmul_layout_text(alg)),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("=13 must divide by"), std::string::npos) << what;
      }
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

TEST(Matmul, EmptyDimensionsGiveTheRightShape) {
  // M, K or N of zero on every algorithm: an empty result, or (K = 0) a result of zeros, never garbage.
  for (const Mesh& mesh : test_meshes()) {
    const std::int64_t p = mesh.size();
    std::vector<Case> cs;
    for (MatmulAlgorithm alg : {MatmulAlgorithm::kLocal, MatmulAlgorithm::kAllGather, MatmulAlgorithm::kReduceScatter,
                                MatmulAlgorithm::kSumma}) {
      if (alg == MatmulAlgorithm::kSumma && mesh.ndim() != 2) continue;
      const std::int64_t q = alg == MatmulAlgorithm::kSumma ? std::lcm(mesh.shape()[0], mesh.shape()[1]) * p : p;
      cs.push_back({alg, 0, 2 * q, 3 * q});
      cs.push_back({alg, 2 * q, 0, 3 * q});
      cs.push_back({alg, 2 * q, 3 * q, 0});
      cs.push_back({alg, 0, 0, 0});
    }
    for (const Case& c : cs) {
      SCOPED_TRACE(mesh.to_string() + " " + matmul_algorithm_name(c.alg) + " M=" + std::to_string(c.m) +
                   " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
      const Array a = ints({c.m, c.k}, 3, DType::kFloat64), b = ints({c.k, c.n}, 4, DType::kFloat64);
      ShardedArray sc = matmul(distribute(a, NamedSharding(mesh, P())), distribute(b, NamedSharding(mesh, P())),
                               MatmulOptions{c.alg});
      EXPECT_EQ(sc.shape(), (Shape{c.m, c.n}));
      const Array got = process_allgather(sc);
      EXPECT_TRUE(equal(got, Array::zeros({c.m, c.n}, DType::kFloat64)));
    }
  }
}

// SUMMA on every 2-d factorisation of the world (p x 1, 1 x p and the square ones), with contiguous, read-only and
// strided operand blocks: panels are read in place, broadcast from the owner's block or (strided) from a copy of it,
// and the operands are never written.
TEST(Matmul, SummaOnEveryGridReadsOperandsWithoutWriting) {
  auto world = Communicator::world();
  const std::int64_t p = world->size();
  enum class Block { kContiguous, kReadOnly, kStrided };
  for (std::int64_t px = 1; px <= p; ++px) {
    if (p % px != 0) continue;
    const std::int64_t py = p / px, l = std::lcm(px, py);
    Mesh mesh({px, py}, {"r", "c"}, world);
    for (Block kind : {Block::kContiguous, Block::kReadOnly, Block::kStrided}) {
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(mesh.to_string() + " block kind " + std::to_string(static_cast<int>(kind)) +
                     (overlap ? " overlap" : ""));
        const Array a = ints({2 * px, 3 * l}, 7, DType::kFloat64), b = ints({3 * l, 5 * py}, 8, DType::kFloat64);
        auto block_of = [&](const Array& g) {
          const Array mine = distribute(g, NamedSharding(mesh, P("r", "c"))).local().contiguous();
          if (kind == Block::kReadOnly)
            return Array::borrow(mine.data(), mine.shape(), mine.dtype(), mine.device(), mine.storage(), {}, true);
          if (kind == Block::kContiguous) return mine;
          // The block as a view into wider rows: every panel of it is strided.
          Array wide = Array::zeros({mine.dim(0), mine.dim(1) + 3}, mine.dtype());
          Array view = wide.slice(1, 1, 1 + mine.dim(1));
          view.copy_from(mine);
          return view;
        };
        const Array ab = block_of(a), bb = block_of(b);
        EXPECT_EQ(ab.is_contiguous() && bb.is_contiguous(), kind != Block::kStrided || ab.numel() == 0);
        const Array a_before = ab.clone(), b_before = bb.clone();
        ShardedArray xa = from_local(ab, a.shape(), NamedSharding(mesh, P("r", "c")));
        ShardedArray xb = from_local(bb, b.shape(), NamedSharding(mesh, P("r", "c")));
        ShardedArray c = matmul(xa, xb, MatmulOptions{MatmulAlgorithm::kSumma, overlap});
        EXPECT_EQ(c.spec(), P("r", "c"));
        EXPECT_TRUE(equal(process_allgather(c), reference(a, b)));
        EXPECT_TRUE(equal(ab, a_before));
        EXPECT_TRUE(equal(bb, b_before));
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
