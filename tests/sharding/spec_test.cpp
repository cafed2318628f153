// PartitionSpec, Mesh and NamedSharding: construction, parsing, shard shapes and index ranges, and bad input.

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
