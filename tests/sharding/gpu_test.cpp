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

}  // namespace
}  // namespace shardkit::testing
