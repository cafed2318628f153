// ShardContext collectives, each against a reference computed from the gathered global array (every rank's input,
// allgathered), on every test mesh and every axis set: each axis, the tuple of all axes, and it reversed.

#include "sharding_test_util.hpp"

namespace shardkit::testing {
namespace {

// Rank r's input: distinct values, (12, 6) unless a test needs another shape.
Array input_of(int r, Shape shape = {12, 6}) { return iota(shape, r + 1); }

// Every rank's input, by world rank, gathered for real (the reference's "global array").
std::vector<Array> gathered_inputs(const Mesh& m, const Shape& shape) {
  Array all = m.comm()->allgather(input_of(m.rank(), shape)).value;
  std::vector<Array> out;
  for (int r = 0; r < m.size(); ++r) out.push_back(all.select(0, r).contiguous());
  return out;
}

template <typename F>
void for_each_case(F f) {
  for (const Mesh& m : test_meshes())
    for (const Axes& axes : axis_sets(m)) {
      SCOPED_TRACE(m.to_string() + " axes " + axes.to_string());
      ShardContext ctx(m);
      f(m, axes, ctx, group_of(m, m.rank(), axes));
    }
}

TEST(ShardContext, AxisIndexAndSize) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    EXPECT_EQ(ctx.axis_size(axes), static_cast<std::int64_t>(group.size()));
    EXPECT_EQ(group[ctx.axis_index(axes)], m.rank());
  });
}

TEST(ShardContext, Reductions) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const auto all = gathered_inputs(m, {12, 6});
    Array sum = Array::zeros({12, 6}, DType::kFloat64), mx = all[group[0]].clone(), mn = all[group[0]].clone();
    for (int r : group) {
      const auto* p = all[r].data_as<double>();
      for (std::int64_t i = 0; i < 72; ++i) {
        sum.data_as<double>()[i] += p[i];
        mx.data_as<double>()[i] = std::max(mx.data_as<double>()[i], p[i]);
        mn.data_as<double>()[i] = std::min(mn.data_as<double>()[i], p[i]);
      }
    }
    const Array x = input_of(m.rank());
    EXPECT_TRUE(equal(ctx.psum(x, axes), sum));
    EXPECT_TRUE(equal(ctx.pmax(x, axes), mx));
    EXPECT_TRUE(equal(ctx.pmin(x, axes), mn));
    Array mean = sum.clone();
    for (std::int64_t i = 0; i < 72; ++i) mean.data_as<double>()[i] /= static_cast<double>(group.size());
    EXPECT_TRUE(allclose(ctx.pmean(x, axes), mean, 1e-15, 0.0));
  });
}

TEST(ShardContext, AllGatherTiledAndUntiledAnyDimension) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const Shape shape{3, 4, 2};
    const auto all = gathered_inputs(m, shape);
    std::vector<Array> parts;
    for (int r : group) parts.push_back(all[r]);
    const Array x = input_of(m.rank(), shape);
    for (int dim = 0; dim < 3; ++dim) {
      EXPECT_TRUE(equal(ctx.all_gather(x, axes, dim, /*tiled=*/true), concat(parts, dim))) << "tiled dim " << dim;
    }
    for (int dim = 0; dim <= 3; ++dim) {
      EXPECT_TRUE(equal(ctx.all_gather(x, axes, dim, /*tiled=*/false), stack(parts, dim))) << "untiled dim " << dim;
    }
    EXPECT_TRUE(equal(ctx.all_gather(x, axes, -1, true), concat(parts, 2)));
  });
}

TEST(ShardContext, PsumScatterTiledAndUntiled) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const std::int64_t k = static_cast<std::int64_t>(group.size());
    const std::int64_t me = ctx.axis_index(axes);
    for (int dim = 0; dim < 2; ++dim) {
      // Tiled: dimension `dim` of size 2k is summed and cut into k pieces of 2.
      Shape shape{3, 3};
      shape[dim] = 2 * k;
      const auto all = gathered_inputs(m, shape);
      Array sum = Array::zeros(shape, DType::kFloat64);
      for (int r : group)
        for (std::int64_t i = 0; i < sum.numel(); ++i) sum.data_as<double>()[i] += all[r].data_as<double>()[i];
      const Array x = input_of(m.rank(), shape);
      EXPECT_TRUE(equal(ctx.psum_scatter(x, axes, dim, /*tiled=*/true), sum.slice(dim, 2 * me, 2 * me + 2).contiguous()))
          << "tiled dim " << dim;
      // Untiled: dimension `dim` has size k and disappears.
      Shape ushape{3, 3};
      ushape[dim] = k;
      const auto uall = gathered_inputs(m, ushape);
      Array usum = Array::zeros(ushape, DType::kFloat64);
      for (int r : group)
        for (std::int64_t i = 0; i < usum.numel(); ++i) usum.data_as<double>()[i] += uall[r].data_as<double>()[i];
      EXPECT_TRUE(equal(ctx.psum_scatter(input_of(m.rank(), ushape), axes, dim, false), usum.select(dim, me).contiguous()))
          << "untiled dim " << dim;
    }
    if (k > 1) {
      EXPECT_THROW(ctx.psum_scatter(input_of(m.rank(), {k + 1, 2}), axes, 0, true), InvalidArgument);
      EXPECT_THROW(ctx.psum_scatter(input_of(m.rank(), {k + 1, 2}), axes, 0, false), InvalidArgument);
    }
  });
}

TEST(ShardContext, PpermuteShiftsAndZeroFills) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const int k = static_cast<int>(group.size());
    const int me = static_cast<int>(ctx.axis_index(axes));
    const auto all = gathered_inputs(m, {12, 6});
    const Array x = input_of(m.rank());
    // A cyclic shift: everyone receives from the member before it.
    std::vector<std::pair<int, int>> shift;
    for (int i = 0; i < k; ++i) shift.emplace_back(i, (i + 1) % k);
    EXPECT_TRUE(equal(ctx.ppermute(x, axes, shift), all[group[(me + k - 1) % k]]));
    // A chain: the middle members send and receive, the ends only one of the two (and the first gets zeros). Each
    // member's exchange must meet its peers' on one backend, shm forced or not (sharding_ppermute_shm).
    std::vector<std::pair<int, int>> chain;
    for (int i = 0; i + 1 < k; ++i) chain.emplace_back(i, i + 1);
    const Array moved = ctx.ppermute(x, axes, chain);
    EXPECT_TRUE(equal(moved, me == 0 ? Array::zeros({12, 6}, DType::kFloat64) : all[group[me - 1]]));
    // One pair only: the last member receives from the first; everyone else gets zeros.
    const Array got = ctx.ppermute(x, axes, {{0, k - 1}});
    if (me == k - 1) {
      EXPECT_TRUE(equal(got, all[group[0]]));
    } else {
      EXPECT_TRUE(equal(got, Array::zeros({12, 6}, DType::kFloat64)));
    }
    EXPECT_THROW(ctx.ppermute(x, axes, {{0, k}}), InvalidArgument);
    if (k > 1) {
      EXPECT_THROW(ctx.ppermute(x, axes, {{0, 1}, {0, 0}}), InvalidArgument);  // source twice
    }
  });
}

TEST(ShardContext, AllToAllAnyDimensionsTiledAndUntiled) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const std::int64_t k = static_cast<std::int64_t>(group.size());
    const std::int64_t me = ctx.axis_index(axes);
    for (int split = 0; split < 3; ++split) {
      for (int cat = 0; cat < 3; ++cat) {
        // Tiled: split `split` (size 2k) into k chunks of 2, chunk j to member j, concatenate along `cat`.
        Shape shape{3, 2, 5};
        shape[split] = 2 * k;
        const auto all = gathered_inputs(m, shape);
        std::vector<Array> chunks;
        for (int r : group) chunks.push_back(all[r].slice(split, 2 * me, 2 * me + 2).contiguous());
        EXPECT_TRUE(equal(ctx.all_to_all(input_of(m.rank(), shape), axes, split, cat, true), concat(chunks, cat)))
            << "tiled split " << split << " concat " << cat;
        // Untiled: `split` has size k and goes; a new axis of size k appears at `cat`.
        Shape ushape{3, 2, 5};
        ushape[split] = k;
        const auto uall = gathered_inputs(m, ushape);
        std::vector<Array> pieces;
        for (int r : group) pieces.push_back(uall[r].select(split, me).contiguous());
        const Array want = split == cat ? concat([&] {
          std::vector<Array> v;
          for (int r : group) v.push_back(uall[r].slice(split, me, me + 1).contiguous());
          return v;
        }(), cat)
                                        : stack(pieces, cat);
        EXPECT_TRUE(equal(ctx.all_to_all(input_of(m.rank(), ushape), axes, split, cat, false), want))
            << "untiled split " << split << " concat " << cat;
      }
    }
    if (k > 1) {
      EXPECT_THROW(ctx.all_to_all(input_of(m.rank(), {k + 1, 2}), axes, 0, 1, true), InvalidArgument);
    }
  });
}

TEST(ShardContext, Pbroadcast) {
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const int k = static_cast<int>(group.size());
    const auto all = gathered_inputs(m, {12, 6});
    EXPECT_TRUE(equal(ctx.pbroadcast(input_of(m.rank()), axes, k - 1), all[group[k - 1]]));
    EXPECT_THROW(ctx.pbroadcast(input_of(m.rank()), axes, k), InvalidArgument);
  });
}

// On permuted meshes (rank devices[p] at row-major position p), axis indices and the order in which collectives
// along an axis deliver blocks follow the mesh coordinates, not the ranks. Each rank contributes its rank number;
// the expected orders are worked out by hand from the device arrays of permuted_meshes().
struct PermutedCase {
  Axes axes;
  std::vector<std::vector<double>> gathered;  // by rank: the ranks along `axes`, in axis-index order
  std::vector<std::int64_t> index;            // by rank: axis_index(axes)
};

std::vector<PermutedCase> permuted_cases(const Mesh& m) {
  if (m.size() == 2) return {{"x", {{1, 0}, {1, 0}}, {1, 0}}};                  // [1, 0]
  if (m.size() == 3) return {{"x", {{2, 0, 1}, {2, 0, 1}, {2, 0, 1}}, {1, 2, 0}}};  // [2, 0, 1]
  const std::vector<double> line = {2, 0, 3, 1};
  if (m.ndim() == 1) return {{"x", {line, line, line, line}, {1, 3, 0, 2}}};  // [2, 0, 3, 1]
  if (m.ndim() == 2) {
    // [[3, 1], [2, 0]]: columns (x varies) are {3, 2} and {1, 0}; rows (y varies) {3, 1} and {2, 0}.
    const std::vector<double> xy = {3, 1, 2, 0}, yx = {3, 2, 1, 0};
    return {{"x", {{1, 0}, {1, 0}, {3, 2}, {3, 2}}, {1, 0, 1, 0}},
            {"y", {{2, 0}, {3, 1}, {2, 0}, {3, 1}}, {1, 1, 0, 0}},
            {Axes{"x", "y"}, {xy, xy, xy, xy}, {3, 1, 2, 0}},
            {Axes{"y", "x"}, {yx, yx, yx, yx}, {3, 2, 1, 0}}};
  }
  // (2,1,2) as [1, 3, 0, 2]: rank 1 at (0,0,0), 3 at (0,0,1), 0 at (1,0,0), 2 at (1,0,1).
  const std::vector<double> zyx = {1, 0, 3, 2};
  return {{"x", {{1, 0}, {1, 0}, {3, 2}, {3, 2}}, {1, 0, 1, 0}},
          {"z", {{0, 2}, {1, 3}, {0, 2}, {1, 3}}, {0, 0, 1, 1}},
          {"y", {{0}, {1}, {2}, {3}}, {0, 0, 0, 0}},
          {Axes{"z", "y", "x"}, {zyx, zyx, zyx, zyx}, {1, 0, 3, 2}}};
}

TEST(ShardContext, PermutedMeshesFollowCoordinates) {
  const std::vector<Mesh> meshes = permuted_meshes();
  if (meshes.empty()) GTEST_SKIP() << "one rank has one order";
  for (const Mesh& m : meshes) {
    ShardContext ctx(m);
    const int me = m.rank();
    for (const PermutedCase& c : permuted_cases(m)) {
      SCOPED_TRACE(m.to_string() + " axes " + c.axes.to_string());
      const std::vector<double>& order = c.gathered[me];
      const auto k = static_cast<std::int64_t>(order.size());
      const std::int64_t i = c.index[me];
      EXPECT_EQ(ctx.axis_index(c.axes), i);
      const Array x = Array::from_values<double>({static_cast<double>(me)});
      EXPECT_EQ(ctx.all_gather(x, c.axes, 0, /*tiled=*/true).to_vector<double>(), order);
      const Array stacked = ctx.all_gather(x, c.axes, 0, /*tiled=*/false);
      EXPECT_EQ(stacked.shape(), (Shape{k, 1}));
      EXPECT_EQ(stacked.to_vector<double>(), order);
      // A cyclic shift i -> i + 1 along the axes: each rank receives from the one before it in coordinate order.
      std::vector<std::pair<int, int>> shift;
      for (int j = 0; j < k; ++j) shift.emplace_back(j, static_cast<int>((j + 1) % k));
      EXPECT_EQ(ctx.ppermute(x, c.axes, shift).to_vector<double>(),
                (std::vector<double>{order[static_cast<std::size_t>((i + k - 1) % k)]}));
      // psum_scatter of [10 * rank + j for j < k]: member i keeps entry i of the sum, 10 * sum(ranks) + k * i.
      std::vector<double> v;
      for (std::int64_t j = 0; j < k; ++j) v.push_back(10.0 * me + static_cast<double>(j));
      double ranks = 0;
      for (double r : order) ranks += r;
      EXPECT_EQ(ctx.psum_scatter(Array::from_values<double>(std::span<const double>(v)), c.axes, 0, true)
                    .to_vector<double>(),
                (std::vector<double>{10.0 * ranks + static_cast<double>(k * i)}));
    }
  }
}

// JAX's pmean of integers is psum(x) / n with jax.numpy's promotion (64-bit types enabled): float64 for 64-bit
// integers, float32 for smaller integers and bool (summed as int32).
TEST(ShardContext, PmeanOfIntegersIsTheFloatingMean) {
  const Mesh& m = test_meshes().front();  // the line over every rank
  ShardContext ctx(m);
  const int n = static_cast<int>(m.size()), r = m.rank();
  // Sum over ranks of [r, 3r + 1] is [n(n-1)/2, 3n(n-1)/2 + n].
  const double s0 = n * (n - 1) / 2.0, s1 = 3.0 * n * (n - 1) / 2.0 + n;
  const Array i32 = ctx.pmean(Array::from_values<std::int32_t>({r, 3 * r + 1}), "x");
  EXPECT_EQ(i32.dtype(), DType::kFloat32);
  EXPECT_EQ(i32.to_vector<float>(), (std::vector<float>{static_cast<float>(s0) / static_cast<float>(n),
                                                        static_cast<float>(s1) / static_cast<float>(n)}));
  const Array u8 = ctx.pmean(Array::from_values<std::uint8_t>({static_cast<std::uint8_t>(r)}), "x");
  EXPECT_EQ(u8.dtype(), DType::kFloat32);
  EXPECT_EQ(u8.to_vector<float>(), (std::vector<float>{static_cast<float>(s0) / static_cast<float>(n)}));
  const Array i64 = ctx.pmean(Array::from_values<std::int64_t>({r, 3 * r + 1}), "x");
  EXPECT_EQ(i64.dtype(), DType::kFloat64);
  EXPECT_EQ(i64.to_vector<double>(), (std::vector<double>{s0 / n, s1 / n}));
  EXPECT_EQ(ctx.pmean(Array::from_values<std::uint64_t>({1}), "x").dtype(), DType::kFloat64);
  // bool: the odd ranks hold true, n / 2 of them.
  const Array b = ctx.pmean(Array::from_values<bool>({r % 2 == 1, true}), "x");
  EXPECT_EQ(b.dtype(), DType::kFloat32);
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{static_cast<float>(n / 2) / static_cast<float>(n), 1.0f}));
  // Floating dtypes keep theirs.
  EXPECT_EQ(ctx.pmean(Array::from_values<float>({1.0f}), "x").dtype(), DType::kFloat32);
}

// JAX's result shape of axis collective `op` on a block of shape (s0, s1), at dimension 0 (all_to_all: split 0,
// concat 1), over k members.
Shape jax_shape(AxisOp op, const Shape& s, std::int64_t k, bool tiled) {
  switch (op) {
    case AxisOp::kAllGather: return tiled ? Shape{k * s[0], s[1]} : Shape{k, s[0], s[1]};
    case AxisOp::kPsumScatter: return tiled ? Shape{s[0] / k, s[1]} : Shape{s[1]};
    case AxisOp::kAllToAll: return tiled ? Shape{s[0] / k, s[1] * k} : Shape{s[1], k};
    default: return s;
  }
}

// Every axis collective, on blocks with a zero-size dimension and on blocks whose split dimension does not divide:
// the plan's shape and the result's are JAX's, and every rank refuses alike.
TEST(ShardContext, EveryAxisOpFollowsItsPlanIncludingSizeZero) {
  for (int i = 0; i < kAxisOpCount; ++i) {
    const auto op = static_cast<AxisOp>(i);
    EXPECT_EQ(axis_op_from_name(axis_op_name(op)), op);
  }
  EXPECT_THROW(axis_op_from_name("pswap"), InvalidArgument);
  for_each_case([](const Mesh& m, const Axes& axes, ShardContext& ctx, const std::vector<int>& group) {
    const auto k = static_cast<std::int64_t>(group.size());
    const std::vector<std::pair<int, int>> shift = {{0, static_cast<int>(k) - 1}};
    for (const Shape& shape : {Shape{0, 3}, Shape{2 * k, 0}, Shape{k, 5}}) {
      for (int i = 0; i < kAxisOpCount; ++i) {
        const auto op = static_cast<AxisOp>(i);
        for (bool tiled : {false, true}) {
          const AxisArgs args{.dim = 0, .concat_dim = 1, .tiled = tiled, .source = 0, .perm = shift};
          SCOPED_TRACE(std::string(axis_op_name(op)) + " " + shape_to_string(shape) + (tiled ? " tiled" : ""));
          const bool splits = tiled ? shape[0] % k == 0 : shape[0] == k;
          if ((op == AxisOp::kPsumScatter || op == AxisOp::kAllToAll) && !splits) {
            EXPECT_THROW(plan_axis(op, m, axes, shape, DType::kFloat64, args), InvalidArgument);
            continue;
          }
          const AxisPlan p = plan_axis(op, m, axes, shape, DType::kFloat64, args);
          EXPECT_EQ(p.shape, jax_shape(op, shape, k, tiled));
          EXPECT_EQ(ctx.run(op, iota(shape, m.rank() + 1), axes, args).shape(), p.shape);
        }
      }
    }
  });
}

TEST(ShardContext, UnknownAndRepeatedAxes) {
  ShardContext ctx(test_meshes().front());
  const Array x = input_of(0);
  EXPECT_THROW(ctx.psum(x, "nope"), InvalidArgument);
  EXPECT_THROW(ctx.all_gather(x, Axes{"x", "x"}), InvalidArgument);
  EXPECT_THROW(ctx.axis_index("nope"), InvalidArgument);
}

}  // namespace
}  // namespace shardkit::testing
