// shard_map: in_specs / out_specs semantics, the check_rep run-time check, and bad input.

#include <cmath>
#include <limits>

#include "sharding_test_util.hpp"

namespace shardkit::testing {
namespace {

Array times_two(const Array& x) {
  Array y = x.clone();
  auto* p = y.data_as<double>();
  for (std::int64_t i = 0; i < y.numel(); ++i) p[i] *= 2;
  return y;
}

TEST(ShardMap, ElementwiseKernelOnShards) {
  for (const Mesh& m : test_meshes()) {
    SCOPED_TRACE(m.to_string());
    const Axes all(m.axis_names());
    const Array g = iota({5 * m.size()});
    ShardedArray x = distribute(g, NamedSharding(m, P(all)));
    auto out = shard_map(
        [](ShardContext&, std::span<const Array> in) {
          EXPECT_EQ(in[0].numel(), 5);  // each rank sees its own block of 5
          return std::vector<Array>{times_two(in[0])};
        },
        m, {P(all)}, {P(all)}, {x});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape(), (Shape{5 * m.size()}));
    EXPECT_TRUE(equal(process_allgather(out[0]), times_two(g)));
  }
}

TEST(ShardMap, InSpecsReshardAndUnmentionedAxesGiveTheFullExtent) {
  for (const Mesh& m : test_meshes()) {
    SCOPED_TRACE(m.to_string());
    const std::string& a = m.axis_names().front();
    const Array g = iota({4 * m.size(), 6});
    // Held replicated, consumed sharded along `a` on dimension 0: each block has the full extent of dimension 1.
    ShardedArray x = distribute(g, NamedSharding(m, P()));
    auto out = shard_map(
        [&](ShardContext& ctx, std::span<const Array> in) {
          const std::int64_t k = ctx.axis_size(a);
          EXPECT_EQ(in[0].shape(), (Shape{4 * m.size() / k, 6}));
          return std::vector<Array>{in[0].clone()};
        },
        m, {P(a)}, {P(a)}, {x});
    EXPECT_TRUE(equal(process_allgather(out[0]), g));
  }
}

TEST(ShardMap, ReplicatedOutputsAfterPsum) {
  for (const Mesh& m : test_meshes()) {
    SCOPED_TRACE(m.to_string());
    const Axes all(m.axis_names());
    const Array g = iota({2 * m.size(), 3});
    ShardedArray x = distribute(g, NamedSharding(m, P(all)));
    // Column sums: each block's sum, then psum over every axis; the output is replicated everywhere (P()).
    auto out = shard_map(
        [&](ShardContext& ctx, std::span<const Array> in) {
          Array s = Array::zeros({3}, DType::kFloat64);
          for (std::int64_t i = 0; i < in[0].dim(0); ++i)
            for (int j = 0; j < 3; ++j) s.data_as<double>()[j] += in[0].data_as<double>()[i * 3 + j];
          return std::vector<Array>{ctx.psum(s, all)};
        },
        m, {P(all)}, {P()}, {x});
    Array want = Array::zeros({3}, DType::kFloat64);
    for (std::int64_t i = 0; i < g.dim(0); ++i)
      for (int j = 0; j < 3; ++j) want.data_as<double>()[j] += g.data_as<double>()[i * 3 + j];
    EXPECT_EQ(out[0].shape(), (Shape{3}));
    EXPECT_TRUE(equal(out[0].local(), want));
  }
}

TEST(ShardMap, CheckRepCatchesABrokenPromise) {
  const Mesh& m = test_meshes().front();
  if (m.size() == 1) GTEST_SKIP() << "one rank is always replicated";
  ShardedArray x = distribute(iota({m.size()}), NamedSharding(m, P("x")));
  auto body = [](ShardContext&, std::span<const Array> in) { return std::vector<Array>{in[0].clone()}; };
  // Each rank returns its own (different) block but out_specs P() promises replication over 'x'.
  try {
    shard_map(body, m, {P("x")}, {P()}, {x});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("promises that output 0 is replicated over mesh axes 'x'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("check_vma=False in Python, check_rep=false in C++"), std::string::npos)
        << e.what();
  }
  // Without the check the promise is taken on trust: no error, and the result is built from the blocks.
  auto out = shard_map(body, m, {P("x")}, {P()}, {x}, ShardMapOptions{.check_rep = false});
  EXPECT_EQ(out[0].shape(), (Shape{1}));
}

// check_rep communicates only when an output promises replication over an axis of more than one rank: one allgather
// of hashes then, none when every out_spec names every axis or at one rank (counted by the mesh communicator's
// sequence number).
TEST(ShardMap, CheckRepHashesOnlyWhatIsPromised) {
  const Mesh& m = test_meshes().front();
  ShardedArray x = distribute(iota({m.size()}), NamedSharding(m, P("x")));
  auto same = [](ShardContext&, std::span<const Array> in) { return std::vector<Array>{in[0].clone()}; };
  auto sum = [](ShardContext& ctx, std::span<const Array> in) { return std::vector<Array>{ctx.psum(in[0], "x")}; };
  Communicator& c = *m.comm();
  std::uint64_t before = c.sequence();
  shard_map(same, m, {P("x")}, {P("x")}, {x});  // every axis named: nothing to check
  EXPECT_EQ(c.sequence(), before);
  // P() promises replication over 'x': the psum's allreduce (on the axis communicator, the mesh's for a 1-d mesh in
  // rank order, or its own) and, at more than one rank, one allgather of hashes on the mesh communicator.
  std::shared_ptr<Communicator> axis = m.axis_comm({"x"});
  const std::uint64_t axis_before = axis->sequence();
  before = c.sequence();
  shard_map(sum, m, {P("x")}, {P()}, {x});
  const std::uint64_t psums = axis.get() == &c ? 1 : 0;
  if (axis.get() != &c) {
    EXPECT_EQ(axis->sequence(), axis_before + 1);
  }
  EXPECT_EQ(c.sequence(), before + psums + (m.size() > 1 ? 1 : 0));
  before = c.sequence();
  shard_map(sum, m, {P("x")}, {P()}, {x}, ShardMapOptions{.check_rep = false});
  EXPECT_EQ(c.sequence(), before + psums);
}

// check_rep compares values, not bytes: -0.0 equals 0.0 and NaNs equal NaNs (whatever their payload or sign), as
// a replicated result computed in different orders on different ranks may hold them; different values still fail.
TEST(ShardMap, CheckRepComparesValuesNotBytes) {
  const Mesh& m = test_meshes().front();
  if (m.size() == 1) GTEST_SKIP() << "one rank is always replicated";
  const bool odd = m.rank() % 2 == 1;
  const float nan_a = std::numeric_limits<float>::quiet_NaN();
  const float nan_b = -std::numeric_limits<float>::quiet_NaN();  // another bit pattern
  auto run = [&](Array block) {
    return shard_map([&](ShardContext&, std::span<const Array>) { return std::vector<Array>{block}; }, m, {}, {P()},
                     {});
  };
  EXPECT_NO_THROW(run(Array::from_values<float>({odd ? -0.0f : 0.0f, odd ? nan_b : nan_a, 1.5f})));
  EXPECT_NO_THROW(run(Array::from_values<double>({odd ? -0.0 : 0.0, odd ? -std::nan("7") : std::nan("")})));
  EXPECT_NO_THROW(run(Array::from_values<std::complex<float>>({{odd ? -0.0f : 0.0f, odd ? nan_b : nan_a}})));
  EXPECT_NO_THROW(run(Array::from_values<Half>({float_to_half(odd ? -0.0f : 0.0f), float_to_half(odd ? nan_b : nan_a)})));
  EXPECT_THROW(run(Array::from_values<float>({odd ? 1.0f : 2.0f})), InvalidArgument);
  EXPECT_THROW(run(Array::from_values<float>({odd ? nan_a : 0.0f})), InvalidArgument);
  // Integers are compared as they are.
  EXPECT_THROW(run(Array::from_values<std::int32_t>({odd ? 1 : 0})), InvalidArgument);
}

TEST(ShardMap, SeedMatmulRowShardedTimesReplicated) {
  // The seed's second program: A (M, K) row-sharded, B (K, N) replicated, C = A @ B row-sharded.
  for (const Mesh& m : test_meshes()) {
    const Mesh line = Mesh::line("x", m.comm());
    const std::int64_t M = 8 * line.size(), K = 4, N = 6;
    const Array a = iota({M, K}), b = iota({K, N});
    ShardedArray sa = distribute(a, NamedSharding(line, P("x", kNone)));
    ShardedArray sb = distribute(b, NamedSharding(line, P(kNone, kNone)));
    auto c = shard_map(
        [&](ShardContext&, std::span<const Array> in) {
          Array out = Array::zeros({in[0].dim(0), N}, DType::kFloat64);
          for (std::int64_t i = 0; i < in[0].dim(0); ++i)
            for (std::int64_t j = 0; j < N; ++j)
              for (std::int64_t k = 0; k < K; ++k)
                out.data_as<double>()[i * N + j] += in[0].data_as<double>()[i * K + k] * in[1].data_as<double>()[k * N + j];
          return std::vector<Array>{out};
        },
        line, {P("x", kNone), P(kNone, kNone)}, {P("x", kNone)}, {sa, sb});
    Array want = Array::zeros({M, N}, DType::kFloat64);
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        for (std::int64_t k = 0; k < K; ++k)
          want.data_as<double>()[i * N + j] += a.data_as<double>()[i * K + k] * b.data_as<double>()[k * N + j];
    EXPECT_TRUE(equal(process_allgather(c[0]), want));
    break;  // one line mesh per world size is enough
  }
}

TEST(ShardMap, UnevenInputsEndToEnd) {
  const Mesh& m = test_meshes().front();
  const Array g = iota({2 * m.size() + 1, 2});  // one more row than divides
  ShardedArray x = distribute(g, NamedSharding(m, P("x"), /*uneven=*/true));
  auto out = shard_map([](ShardContext&, std::span<const Array> in) { return std::vector<Array>{times_two(in[0])}; },
                       m, {P("x")}, {P("x")}, {x});
  EXPECT_EQ(out[0].shape(), g.shape());
  EXPECT_TRUE(equal(process_allgather(out[0]), times_two(g)));
}

TEST(ShardMap, BadInput) {
  const Mesh& m = test_meshes().front();
  ShardedArray x = distribute(iota({4 * m.size()}), NamedSharding(m, P("x")));
  auto identity = [](ShardContext&, std::span<const Array> in) { return std::vector<Array>(in.begin(), in.end()); };
  auto expect_error = [](auto f, const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "no error (expected '" << fragment << "')";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([&] { shard_map(identity, m, {P("x"), P()}, {P("x")}, {x}); }, "one in_spec per argument");
  expect_error([&] { shard_map(identity, m, {P("nope")}, {P("x")}, {x}); }, "unknown mesh axis 'nope'");
  expect_error([&] { shard_map(identity, m, {P("x", "x")}, {P("x")}, {x}); }, "uses mesh axis 'x' twice");
  expect_error([&] { shard_map(identity, m, {P(kNone, "x")}, {P("x")}, {x}); }, "has 2 entries but the array has rank 1");
  expect_error([&] { shard_map(identity, m, {P("x")}, {P("x"), P()}, {x}); }, "returned 1 outputs for 2 out_specs");
  expect_error([&] { shard_map(identity, m, {P("x")}, {P("x", kNone)}, {x}); }, "longer than the rank");
}

}  // namespace
}  // namespace shardkit::testing
