// distribute, from_local, gather, process_allgather, reshard and visualize, on every test mesh, with even and
// uneven (opt-in) shards, including empty shards and size-zero arrays.

#include "sharding_test_util.hpp"

namespace shardkit::testing {
namespace {

TEST(Distribute, ScatterAndGatherRoundTrip) {
  for (const Mesh& m : test_meshes()) {
    for (const PartitionSpec& spec : test_specs(m)) {
      SCOPED_TRACE(m.to_string() + " " + spec.to_string());
      const NamedSharding s(m, spec);
      const Array g = iota({12, 12});
      const int root = static_cast<int>(m.size()) - 1;
      ShardedArray x = distribute(m.rank() == root ? g : Array(), s, root);
      EXPECT_EQ(x.shape(), (Shape{12, 12}));
      EXPECT_TRUE(equal(x.local(), block(g, s, m.rank())));
      Array back = gather(x, 0);
      if (m.rank() == 0) {
        EXPECT_TRUE(equal(back, g));
      } else {
        EXPECT_EQ(back.numel(), 0);
      }
      EXPECT_TRUE(equal(process_allgather(x), g));
    }
  }
}

// distribute, gather and from_local on permuted meshes: rank devices[p] holds the block of position p. Blocks of
// arange worked out by hand from the device arrays of permuted_meshes().
TEST(Distribute, PermutedMeshesPlaceBlocksByDeviceOrder) {
  const std::vector<Mesh> meshes = permuted_meshes();
  if (meshes.empty()) GTEST_SKIP() << "one rank has one order";
  for (const Mesh& m : meshes) {
    SCOPED_TRACE(m.to_string());
    const int r = m.rank();
    Array g;
    PartitionSpec spec;
    std::vector<std::vector<double>> want;  // by rank, row-major
    if (m.ndim() == 1) {
      g = iota({2 * m.size()});
      spec = P("x");
      if (m.size() == 2) want = {{2, 3}, {0, 1}};                              // [1, 0]
      if (m.size() == 3) want = {{2, 3}, {4, 5}, {0, 1}};                      // [2, 0, 1]
      if (m.size() == 4) want = {{2, 3}, {6, 7}, {0, 1}, {4, 5}};              // [2, 0, 3, 1]
    } else if (m.ndim() == 2) {
      g = iota({4, 4});
      spec = P("x", "y");  // [[3, 1], [2, 0]]
      want = {{10, 11, 14, 15}, {2, 3, 6, 7}, {8, 9, 12, 13}, {0, 1, 4, 5}};
    } else {
      g = iota({4, 2});
      spec = P(Axes{"z", "x"});  // (2,1,2) as [1, 3, 0, 2]: row index z * 2 + x
      want = {{2, 3}, {0, 1}, {6, 7}, {4, 5}};
    }
    const NamedSharding s(m, spec);
    ShardedArray x = distribute(g, s);
    EXPECT_EQ(x.local().contiguous().to_vector<double>(), want[r]);
    Array back = gather(x, 0);
    if (r == 0) {
      EXPECT_TRUE(equal(back, g));
    }
    // Each rank wraps its hand-made block: the global array comes back whole.
    Array mine = Array::from_values<double>(std::span<const double>(want[r]), x.local().shape());
    EXPECT_TRUE(equal(process_allgather(from_local(mine, g.shape(), s)), g));
  }
}

TEST(Distribute, EveryDtype) {
  const Mesh& m = test_meshes().front();
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    const Array g = d == DType::kBool ? Array::arange(8 * m.size(), d) : iota({2 * m.size(), 3}, 0, d);
    const NamedSharding s(m, P("x"));
    ShardedArray x = distribute(g, s);
    EXPECT_EQ(x.dtype(), d);
    EXPECT_TRUE(equal(process_allgather(x), g));
  }
}

TEST(Distribute, UnevenShardsEndToEnd) {
  for (const Mesh& m : test_meshes()) {
    const Axes all(m.axis_names());
    for (std::int64_t rows : {0, 1, 5, 7, 13}) {
      SCOPED_TRACE(m.to_string() + " rows=" + std::to_string(rows));
      const NamedSharding s(m, P(all), /*uneven=*/true);
      const Array g = iota({rows, 3});
      ShardedArray x = distribute(g, s);
      EXPECT_EQ(x.local().shape(), s.local_shape({rows, 3}, m.rank()));
      EXPECT_TRUE(equal(x.local(), block(g, s, m.rank())));
      EXPECT_TRUE(equal(process_allgather(x), g));
      Array back = gather(x, 0);
      if (m.rank() == 0) {
        EXPECT_TRUE(equal(back, g));
      }
      // Uneven to replicated and back, and between dimensions.
      const NamedSharding rep(m, P(), true);
      ShardedArray r = reshard(x, rep);
      EXPECT_TRUE(equal(r.local(), g));
      const NamedSharding cols(m, P(kNone, all), true);
      ShardedArray c = reshard(x, cols);
      EXPECT_TRUE(equal(c.local(), block(g, cols, m.rank())));
      EXPECT_TRUE(equal(process_allgather(reshard(c, s)), g));
    }
  }
}

TEST(Distribute, IndivisibleWithoutOptInIsRefused) {
  const Mesh& m = test_meshes().front();
  if (m.size() == 1) GTEST_SKIP() << "everything divides by 1";
  EXPECT_THROW(distribute(iota({m.size() + 1, 2}), NamedSharding(m, P("x"))), InvalidArgument);
}

TEST(FromLocal, WrapsWithoutCommunicationAndChecksTheBlock) {
  const Mesh& m = test_meshes().front();
  const NamedSharding s(m, P("x"));
  const Array g = iota({4 * m.size(), 2});
  ShardedArray x = from_local(block(g, s, m.rank()), {4 * m.size(), 2}, s);
  EXPECT_TRUE(equal(process_allgather(x), g));
  EXPECT_THROW(from_local(Array::zeros({3, 2}, DType::kFloat64), {4 * m.size(), 2}, s), InvalidArgument);
}

TEST(Reshard, EveryPairOfSpecs) {
  for (const Mesh& m : test_meshes()) {
    const auto specs = test_specs(m);
    const Array g = iota({12, 12});
    for (const auto& from : specs) {
      const NamedSharding sf(m, from);
      ShardedArray x = distribute(g, sf);
      for (const auto& to : specs) {
        SCOPED_TRACE(m.to_string() + " " + from.to_string() + " -> " + to.to_string());
        const NamedSharding st(m, to);
        ShardedArray y = reshard(x, st);
        EXPECT_EQ(y.sharding(), st);
        EXPECT_TRUE(equal(y.local(), block(g, st, m.rank())));
      }
    }
  }
}

TEST(Reshard, ThreeDimensionsAndZeroSize) {
  for (const Mesh& m : test_meshes()) {
    const auto& n = m.axis_names();
    const Array g = iota({12, 2, 12});
    ShardedArray x = distribute(g, NamedSharding(m, P(kNone, kNone, n.back())));
    const NamedSharding t(m, P(n.front(), kNone, kNone));
    EXPECT_TRUE(equal(reshard(x, t).local(), block(g, t, m.rank())));
    const Array empty = iota({0, 4 * m.size()});
    ShardedArray e = distribute(empty, NamedSharding(m, P(kNone, Axes(n))));
    EXPECT_EQ(reshard(e, NamedSharding(m, P())).local().shape(), (Shape{0, 4 * m.size()}));
  }
}

TEST(Reshard, OtherMeshIsRefused) {
  const Mesh& m = test_meshes().front();
  const Mesh other = Mesh::line("other");
  ShardedArray x = distribute(iota({m.size() * 2}), NamedSharding(m, P("x")));
  EXPECT_THROW(reshard(x, NamedSharding(other, P("other"))), InvalidArgument);
}

TEST(Visualize, ShowsWhichRanksHoldWhichBlock) {
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  const std::string v = visualize_sharding({4, 4}, NamedSharding(m, P("x")));
  EXPECT_NE(v.find("rows 0:2 | ranks 0,1 |"), std::string::npos) << v;
  EXPECT_NE(v.find("rows 2:4 | ranks 2,3 |"), std::string::npos) << v;
  const std::string w = visualize_sharding({4, 4}, NamedSharding(m, P("x", "y")));
  EXPECT_NE(w.find("rows 0:2 | rank 0   | rank 1   |"), std::string::npos) << w;
  EXPECT_NE(w.find("rows 2:4 | rank 2   | rank 3   |"), std::string::npos) << w;
  EXPECT_NE(w.find("cols 2:4"), std::string::npos) << w;
  const std::string line = visualize_sharding({6}, NamedSharding(Mesh::abstract({3}, {"x"}), P("x")));
  EXPECT_NE(line.find("| rank 0 | rank 1 | rank 2 |"), std::string::npos) << line;
}

TEST(Visualize, PermutedMeshShowsTheRanksWhereTheDeviceArrayPutsThem) {
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"}, {3, 1, 2, 0});  // [[3, 1], [2, 0]]
  EXPECT_EQ(visualize_sharding({4, 4}, NamedSharding(m, P("x", "y"))),
            "NamedSharding(mesh=Mesh(x=2, y=2, devices=[3, 1, 2, 0]), spec=P('x', 'y')) of shape (4, 4)\n"
            "           cols 0:2   cols 2:4  \n"
            "         +----------+----------+\n"
            "rows 0:2 | rank 3   | rank 1   |\n"
            "         +----------+----------+\n"
            "rows 2:4 | rank 2   | rank 0   |\n"
            "         +----------+----------+\n");
  const std::string rows = visualize_sharding({4, 4}, NamedSharding(m, P("x")));
  EXPECT_NE(rows.find("rows 0:2 | ranks 1,3 |"), std::string::npos) << rows;
  EXPECT_NE(rows.find("rows 2:4 | ranks 0,2 |"), std::string::npos) << rows;
}

}  // namespace
}  // namespace shardkit::testing
