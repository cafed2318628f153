// PartitionSpec, Mesh and NamedSharding: construction, parsing, shard shapes and index ranges, and bad input.

#include <array>

#include "sharding_test_util.hpp"

namespace shardkit::testing {
namespace {

TEST(PartitionSpec, BuildAndPrint) {
  EXPECT_EQ(P().to_string(), "P()");
  EXPECT_EQ(P("x", kNone).to_string(), "P('x', None)");
  EXPECT_EQ(P(Axes{"x", "y"}, "z").to_string(), "P(('x', 'y'), 'z')");
  EXPECT_EQ(P("x", kNone, kNone), P("x"));  // trailing None entries are implied
  EXPECT_FALSE(P("x") == P(kNone, "x"));
  EXPECT_EQ(P(Axes{"x", "y"}).used_axes(), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(P("x").axes(5).empty());
}

TEST(PartitionSpec, Parse) {
  EXPECT_EQ(PartitionSpec::parse("P('x', None)"), P("x", kNone));
  EXPECT_EQ(PartitionSpec::parse("(\"x\", 'y'), None, z"), P(Axes{"x", "y"}, kNone, "z"));
  EXPECT_EQ(PartitionSpec::parse(""), P());
  EXPECT_EQ(PartitionSpec::parse("P()"), P());
  EXPECT_EQ(PartitionSpec::parse("x,"), P("x"));
  EXPECT_EQ(PartitionSpec::parse("()"), P(kNone));
  for (const char* bad : {"P('x'", "('x' 'y')", "'x", "1x", "P(x) y", "(None)", "x,,y", "''"})
    EXPECT_THROW(PartitionSpec::parse(bad), InvalidArgument) << bad;
}

TEST(Mesh, ParseShapes) {
  MeshShape a = parse_mesh_shape("x=2, y=4");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(a.names, (std::vector<std::string>{"x", "y"}));
  MeshShape b = parse_mesh_shape("2x1x3");
  EXPECT_EQ(b.shape, (std::vector<std::int64_t>{2, 1, 3}));
  EXPECT_EQ(b.names, (std::vector<std::string>{"x", "y", "z"}));
  for (const char* bad : {"", "x=", "=2", "x=two", "2x", "x=2,,y=3", "x=-1", "x=0", "2x0", "x=2,x=3"})
    EXPECT_THROW(parse_mesh_shape(bad), InvalidArgument) << bad;
}

TEST(Mesh, CoordinatesAndErrors) {
  const Mesh m = Mesh::abstract({4, 2}, {"x", "y"});
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.coords(5), (std::vector<std::int64_t>{2, 1}));
  EXPECT_EQ(m.rank_at({3, 0}), 6);
  EXPECT_EQ(m.axis_index(Axes{"y", "x"}, 5), 1 * 4 + 2);
  EXPECT_EQ(m.axis_size(Axes{"x", "y"}), 8);
  EXPECT_EQ(m.to_string(), "Mesh(x=4, y=2)");
  EXPECT_EQ(m.rank(), -1);
  EXPECT_THROW(m.axis_comm("x"), InvalidArgument);
  try {
    m.axis_size("z");
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown mesh axis 'z' (the mesh has axes 'x', 'y')"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.axis_size(Axes{"x", "x"}), InvalidArgument);
  EXPECT_THROW(Mesh::abstract({2, 2}, {"x", "x"}), InvalidArgument);
  EXPECT_THROW(Mesh::abstract({0}, {"x"}), InvalidArgument);
  EXPECT_THROW(Mesh::abstract({2}, {"x", "y"}), InvalidArgument);
  // More positions than int ranks can number, with and without 64-bit overflow (found by tests/fuzz/spec_fuzzer).
  EXPECT_THROW(Mesh::abstract({65536, 65536}, {"x", "y"}), InvalidArgument);
  EXPECT_THROW(Mesh::abstract({1LL << 62, 4}, {"x", "y"}), InvalidArgument);
}

TEST(Mesh, SizeMustEqualTheWorld) {
  const int n = runtime().size();
  try {
    Mesh m({n + 1}, {"x"});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the mesh size must equal the number of processes"), std::string::npos)
        << e.what();
  }
  Mesh ok = Mesh::line("i");
  EXPECT_EQ(ok.size(), n);
  EXPECT_EQ(ok.rank(), runtime().rank());
}

// Rank devices[p] sits at row-major position p (JAX's placement of devices.flat[p]); coordinates, axis indices and
// to_string follow. Expected values worked out by hand from the device arrays.
TEST(Mesh, DeviceOrderIsHonouredIn1d2dAnd3d) {
  const Mesh line = Mesh::abstract({4}, {"x"}, {2, 0, 3, 1});
  EXPECT_EQ(line.coords(2), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(line.coords(0), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(line.coords(1), (std::vector<std::int64_t>{3}));
  EXPECT_EQ(line.rank_at({2}), 3);
  for (auto [rank, index] : {std::pair{0, 1}, {1, 3}, {2, 0}, {3, 2}}) EXPECT_EQ(line.axis_index("x", rank), index);
  EXPECT_FALSE(line.is_row_major());
  EXPECT_EQ(line.to_string(), "Mesh(x=4, devices=[2, 0, 3, 1])");

  // (2,2) as [[3, 1], [2, 0]]: rank 3 at (0,0), 1 at (0,1), 2 at (1,0), 0 at (1,1).
  const Mesh grid = Mesh::abstract({2, 2}, {"x", "y"}, {3, 1, 2, 0});
  const std::vector<std::vector<std::int64_t>> coords = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};
  // axis_index over x, y, (x, y), (y, x) for ranks 0..3.
  const std::vector<std::array<std::int64_t, 4>> index = {{1, 1, 3, 3}, {0, 1, 1, 2}, {1, 0, 2, 1}, {0, 0, 0, 0}};
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(grid.coords(r), coords[r]);
    EXPECT_EQ(grid.rank_at(coords[r]), r);
    EXPECT_EQ(grid.axis_index("x", r), index[r][0]);
    EXPECT_EQ(grid.axis_index("y", r), index[r][1]);
    EXPECT_EQ(grid.axis_index(Axes{"x", "y"}, r), index[r][2]);
    EXPECT_EQ(grid.axis_index(Axes{"y", "x"}, r), index[r][3]);
  }
  EXPECT_EQ(grid.devices(), (std::vector<int>{3, 1, 2, 0}));

  // (2,2,2) as [5, 2, 7, 0, 4, 1, 6, 3]: position p is (p / 4, p / 2 % 2, p % 2).
  const Mesh cube = Mesh::abstract({2, 2, 2}, {"x", "y", "z"}, {5, 2, 7, 0, 4, 1, 6, 3});
  const std::vector<std::vector<std::int64_t>> cube_coords = {{0, 1, 1}, {1, 0, 1}, {0, 0, 1}, {1, 1, 1},
                                                              {1, 0, 0}, {0, 0, 0}, {1, 1, 0}, {0, 1, 0}};
  // axis_index over (z, x) and over (y, z, x) for ranks 0..7.
  const std::vector<std::pair<std::int64_t, std::int64_t>> cube_index = {{2, 6}, {3, 3}, {2, 2}, {3, 7},
                                                                         {1, 1}, {0, 0}, {1, 5}, {0, 4}};
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(cube.coords(r), cube_coords[r]);
    EXPECT_EQ(cube.rank_at(cube_coords[r]), r);
    EXPECT_EQ(cube.axis_index(Axes{"z", "x"}, r), cube_index[r].first);
    EXPECT_EQ(cube.axis_index(Axes{"y", "z", "x"}, r), cube_index[r].second);
  }
  // The identity order is the default, and equality tells device orders apart.
  EXPECT_TRUE(Mesh::abstract({2, 2}, {"x", "y"}, {0, 1, 2, 3}).is_row_major());
  EXPECT_EQ(Mesh::abstract({2, 2}, {"x", "y"}).devices(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Mesh::abstract({2, 2}, {"x", "y"}, {0, 1, 2, 3}).to_string(), "Mesh(x=2, y=2)");
}

TEST(Mesh, DeviceArrayMustBeAPermutationOfTheRanks) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([] { Mesh::abstract({2, 2}, {"x", "y"}, {0, 1, 1, 3}); });
  EXPECT_NE(m.find("device array holds rank 1 twice (it must be a permutation of the ranks 0..3)"), std::string::npos)
      << m;
  m = message([] { Mesh::abstract({2, 2}, {"x", "y"}, {0, 1, 4, 3}); });
  EXPECT_NE(m.find("device array holds rank 4, outside 0..3"), std::string::npos) << m;
  m = message([] { Mesh::abstract({2}, {"x"}, {-1, 0}); });
  EXPECT_NE(m.find("device array holds rank -1, outside 0..1"), std::string::npos) << m;
  m = message([] { Mesh::abstract({2, 2}, {"x", "y"}, {0, 1, 2}); });
  EXPECT_NE(m.find("the device array must hold one rank per position of the shape (2, 2)"), std::string::npos) << m;
  // On a communicator as well (the check runs before the size is compared).
  const int n = runtime().size();
  std::vector<int> repeated(static_cast<std::size_t>(n), 0);
  if (n > 1) {
    m = message([&] { Mesh({n}, {"x"}, repeated); });
    EXPECT_NE(m.find("device array holds rank 0 twice"), std::string::npos) << m;
  }
}

// DESIGN.md's worked check: mesh (4,2) over ('x','y'), global (8,4).
TEST(NamedSharding, WorkedExample) {
  const Mesh m = Mesh::abstract({4, 2}, {"x", "y"});
  const Shape g{8, 4};
  EXPECT_EQ(NamedSharding(m, P("x", "y")).shard_shape(g), (Shape{2, 2}));
  EXPECT_EQ(NamedSharding(m, P("x")).shard_shape(g), (Shape{2, 4}));
  EXPECT_EQ(NamedSharding(m, P("y")).shard_shape(g), (Shape{4, 4}));
  EXPECT_EQ(NamedSharding(m, P(kNone, "y")).shard_shape(g), (Shape{8, 2}));
  EXPECT_EQ(NamedSharding(m, P(kNone, "x")).shard_shape(g), (Shape{8, 1}));
  EXPECT_EQ(NamedSharding(m, P(Axes{"x", "y"})).shard_shape(g), (Shape{1, 4}));
  EXPECT_EQ(NamedSharding(m, P()).shard_shape(g), (Shape{8, 4}));
}

TEST(NamedSharding, IndexRangesFollowTheMesh) {
  const Mesh m = Mesh::abstract({4, 2}, {"x", "y"});
  const NamedSharding s(m, P(Axes{"x", "y"}, kNone));
  // Rank 5 = (x=2, y=1): shard 2*2+1 = 5 of 8 along dimension 0.
  EXPECT_EQ(s.index({8, 4}, 5), (std::vector<IndexRange>{{5, 6}, {0, 4}}));
  const NamedSharding yx(m, P(Axes{"y", "x"}));
  EXPECT_EQ(yx.index({8, 4}, 5)[0], (IndexRange{6, 7}));  // y major: 1*4 + 2
  const NamedSharding rep(m, P("x"));
  EXPECT_EQ(rep.replicated_axes(), (std::vector<std::string>{"y"}));
  EXPECT_TRUE(rep.is_primary(4));   // (2, 0)
  EXPECT_FALSE(rep.is_primary(5));  // (2, 1)
  EXPECT_TRUE(NamedSharding(m, P()).fully_replicated());
}

// Blocks on permuted meshes: rank devices[p] holds the block of position p. The expected ranges are worked out by
// hand (and agree with jax.sharding.NamedSharding.devices_indices_map on the same device arrays).
TEST(NamedSharding, BlocksFollowTheDeviceOrder) {
  using R = std::vector<IndexRange>;
  const NamedSharding line(Mesh::abstract({4}, {"x"}, {2, 0, 3, 1}), P("x"));
  const std::vector<R> line_want = {{{2, 4}}, {{6, 8}}, {{0, 2}}, {{4, 6}}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(line.index({8}, r), line_want[r]) << "rank " << r;

  const Mesh grid = Mesh::abstract({2, 2}, {"x", "y"}, {3, 1, 2, 0});
  const std::vector<R> xy = {{{2, 4}, {3, 6}}, {{0, 2}, {3, 6}}, {{2, 4}, {0, 3}}, {{0, 2}, {0, 3}}};
  const std::vector<R> x_only = {{{2, 4}, {0, 6}}, {{0, 2}, {0, 6}}, {{2, 4}, {0, 6}}, {{0, 2}, {0, 6}}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(NamedSharding(grid, P("x", "y")).index({4, 6}, r), xy[r]) << "rank " << r;
    EXPECT_EQ(NamedSharding(grid, P("x")).index({4, 6}, r), x_only[r]) << "rank " << r;
  }
  // The first copy of a replicated block is the one at coordinate 0 on the replicated axes: ranks 3 and 1 (x = 0).
  const NamedSharding rows(grid, P("y"));
  EXPECT_EQ((std::vector<bool>{rows.is_primary(0), rows.is_primary(1), rows.is_primary(2), rows.is_primary(3)}),
            (std::vector<bool>{false, true, false, true}));

  const NamedSharding cube(Mesh::abstract({2, 2, 2}, {"x", "y", "z"}, {5, 2, 7, 0, 4, 1, 6, 3}),
                           P(Axes{"z", "y"}, "x"));
  const std::vector<R> cube_want = {{{3, 4}, {0, 3}}, {{2, 3}, {3, 6}}, {{2, 3}, {0, 3}}, {{3, 4}, {3, 6}},
                                    {{0, 1}, {3, 6}}, {{0, 1}, {0, 3}}, {{1, 2}, {3, 6}}, {{1, 2}, {0, 3}}};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(cube.index({4, 6}, r), cube_want[r]) << "rank " << r;
}

TEST(NamedSharding, IndivisibleShapesNameDimensionSizeAndAxes) {
  const Mesh m = Mesh::abstract({4, 2}, {"x", "y"});
  try {
    NamedSharding(m, P(kNone, Axes{"x", "y"})).validate({8, 12});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("dimension 1 of size 12 is not divisible by 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("('x', 'y') (x=4, y=2)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("uneven"), std::string::npos) << msg;
  }
}

TEST(NamedSharding, UnevenIsAnExplicitOptIn) {
  const Mesh m = Mesh::abstract({4}, {"x"});
  const NamedSharding s(m, P("x"), /*uneven=*/true);
  // 10 rows over 4 shards: ceil 3, 3, 3, 1.
  EXPECT_EQ(s.shard_shape({10}), (Shape{3}));
  EXPECT_EQ(s.local_shape({10}, 3), (Shape{1}));
  EXPECT_EQ(s.index({10}, 2)[0], (IndexRange{6, 9}));
  // 5 rows over 4: 2, 2, 1, 0 (a trailing shard may be empty).
  EXPECT_EQ(s.local_shape({5}, 3), (Shape{0}));
  EXPECT_EQ(s.local_shape({0}, 0), (Shape{0}));
  EXPECT_THROW(NamedSharding(m, P("x")).validate({10}), InvalidArgument);
}

// Found by tests/fuzz/spec_fuzzer: sizes near INT64_MAX overflowed the ceiling division, negative sizes passed
// validate() when divisible, and a rank outside the mesh got a block when no dimension was sharded.
TEST(NamedSharding, ExtremeShapesAndRanks) {
  const Mesh m = Mesh::abstract({3}, {"x"});
  const NamedSharding s(m, P("x"), /*uneven=*/true);
  EXPECT_EQ(s.shard_shape({INT64_MAX}), (Shape{INT64_MAX / 3 + 1}));
  EXPECT_EQ(s.index({INT64_MAX}, 2)[0], (IndexRange{2 * (INT64_MAX / 3 + 1), INT64_MAX}));
  EXPECT_THROW(NamedSharding(Mesh::abstract({2}, {"x"}), P("x")).validate({-4}), InvalidArgument);
  EXPECT_THROW(s.shard_shape({-1}), InvalidArgument);
  const NamedSharding rep(Mesh::abstract({2, 2}, {"x", "y"}), P());
  EXPECT_THROW(rep.index({3, 5}, 4), InvalidArgument);
  EXPECT_THROW(rep.index({}, -1), InvalidArgument);
}

TEST(NamedSharding, BadSpecs) {
  const Mesh m = Mesh::abstract({2, 2}, {"x", "y"});
  EXPECT_THROW(NamedSharding(m, P("q")), InvalidArgument);                 // unknown axis
  EXPECT_THROW(NamedSharding(m, P("x", "x")), InvalidArgument);            // axis used twice
  EXPECT_THROW(NamedSharding(m, P(Axes{"y", "y"})), InvalidArgument);      // twice in one tuple
  try {
    NamedSharding(m, P("x", "y", kNone)).validate({4, 4});  // spec longer than the rank
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has 3 entries but the array has rank 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardkit::testing
