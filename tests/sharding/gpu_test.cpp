// Sharded arrays whose local blocks live on the GPU (NCCL underneath). Skips cleanly without a GPU.

#include "sharding_test_util.hpp"
#include "shardkit/core/kernels.hpp"

namespace shardkit::testing {
namespace {

class GpuShards : public ::testing::Test {
 protected:
  void SetUp() override {
    if (runtime().device().kind != DeviceKind::kCUDA) SHARDKIT_GPU_SKIP("no GPU bound to this rank");
  }
  Device gpu() const { return runtime().device(); }
};

TEST_F(GpuShards, DistributeGatherReshardOnTheDevice) {
  const Mesh m = Mesh::line("x");
  const Array g = iota({4 * m.size(), 2 * m.size()}, 0, DType::kFloat32);  // reshards to columns: divisible at any size
  ShardedArray x = distribute(g, NamedSharding(m, P("x")), 0, gpu());
  EXPECT_EQ(x.local().device(), gpu());
  EXPECT_TRUE(equal(process_allgather(x), g));
  ShardedArray y = reshard(x, NamedSharding(m, P(kNone, "x")));
  EXPECT_EQ(y.local().device(), gpu());
  EXPECT_TRUE(equal(y.local().to(Device::cpu()), block(g, y.sharding(), m.rank())));
}

TEST_F(GpuShards, ShardMapWithDeviceCollectives) {
  const Mesh m = Mesh::line("x");
  const Array g = iota({2 * m.size(), 3}, 0, DType::kFloat32);
  ShardedArray x = distribute(g, NamedSharding(m, P("x")), 0, gpu());
  auto out = shard_map(
      [](ShardContext& ctx, std::span<const Array> in) {
        Array doubled = in[0].clone();
        scale(doubled, 2.0);  // a CUDA kernel on the local block
        Array gathered = ctx.all_gather(doubled, "x", 0, true);
        return std::vector<Array>{doubled, ctx.psum(gathered, "x")};
      },
      m, {P("x")}, {P("x"), P()}, {x});
  Array twice = g.clone();
  scale(twice, 2.0);
  EXPECT_TRUE(equal(process_allgather(out[0]), twice));
  Array total = twice.clone();
  scale(total, static_cast<double>(m.size()));
  EXPECT_TRUE(equal(out[1].local().to(Device::cpu()), total));
}

// Every axis collective on device blocks, at non-leading dimensions (strided packing on the device, around the
// asynchronous NCCL operation): the same values as on host blocks (MPI), and the results live on the device.
TEST_F(GpuShards, EveryAxisCollectiveMatchesTheHostPath) {
  const Mesh m = Mesh::line("x");
  const int k = m.size();
  ShardContext host(m), dev(m);
  std::vector<std::pair<int, int>> shift;
  for (int i = 0; i < k; ++i) shift.emplace_back(i, (i + 1) % k);
  const Array x = iota({3, 2 * k, 2}, m.rank() + 1, DType::kFloat32);
  const Array xk = iota({3, k, 2}, m.rank() + 1, DType::kFloat32);
  const Array flags = Array::from_values<bool>({m.rank() % 2 == 0, true, false});
  struct Case {
    AxisOp op;
    const Array* in;
    AxisArgs args;
  };
  const std::vector<Case> cases = {
      {AxisOp::kPsum, &x, {}},
      {AxisOp::kPmean, &x, {}},
      {AxisOp::kPmax, &x, {}},
      {AxisOp::kPsum, &flags, {}},
      {AxisOp::kPmin, &flags, {}},
      {AxisOp::kPmean, &flags, {}},
      {AxisOp::kAllGather, &x, {.dim = 1, .tiled = true}},
      {AxisOp::kAllGather, &x, {.dim = 2}},
      {AxisOp::kPsumScatter, &x, {.dim = 1, .tiled = true}},
      {AxisOp::kPsumScatter, &xk, {.dim = 1}},
      {AxisOp::kAllToAll, &x, {.dim = 1, .concat_dim = 2, .tiled = true}},
      {AxisOp::kAllToAll, &xk, {.dim = 1, .concat_dim = 0}},
      {AxisOp::kPpermute, &x, {.perm = shift}},
      {AxisOp::kPbroadcast, &x, {.source = k - 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(axis_op_name(c.op)) + " of " + shape_to_string(c.in->shape()));
    const Array want = host.run(c.op, *c.in, "x", c.args);
    const Array got = dev.run(c.op, c.in->to(gpu()), "x", c.args);
    EXPECT_EQ(got.device(), gpu());
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_TRUE(equal(got.to(Device::cpu()), want));
  }
}

}  // namespace
}  // namespace shardkit::testing
