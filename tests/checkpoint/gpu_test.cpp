// Checkpoints of ShardedArrays whose blocks live on the GPU: saved from device memory (staged to the host after the
// producing work on the device is done), loaded into device memory on another sharding, and a background save whose
// device blocks are overwritten as soon as save() returns. On the simulated GPU (delays injected into every
// asynchronous copy and kernel) a staging copy that did not wait for the device, or a load that handed back a block
// before its copy to the device finished, reads or returns the wrong bytes. Skips cleanly without a GPU.

#include "checkpoint_test_util.hpp"
#include "shardkit/core/kernels.hpp"

namespace shardkit::testing {
namespace {

namespace ck = shardkit::checkpoint;

class GpuCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    if (runtime().device().kind != DeviceKind::kCUDA) SHARDKIT_GPU_SKIP("no GPU bound to this rank");
  }
  Device gpu() const { return runtime().device(); }
};

TEST_F(GpuCheckpoint, DeviceBlocksSaveAndLoadOntoAnotherShardingInDeviceMemory) {
  auto world = Communicator::world();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const int n = line.size();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt8, DType::kComplex64}) {
    const Shape shape{2 * n + 1, n + 2};  // uneven both ways
    const Array g = test_global(shape, dtype);
    const NamedSharding rows(line, P("x"), true);
    ShardedArray x = distribute(g, rows, 0, gpu());
    ASSERT_EQ(x.local().device(), gpu());
    // Device work the save must see: double the block on the device (float types) just before saving it.
    Array want = g.clone();
    if (dtype == DType::kFloat32 || dtype == DType::kFloat64) {
      Array block = x.local();  // the same device memory
      scale(block, 2.0);
      scale(want, 2.0);
    }
    const std::string key = "a/" + std::string(dtype_name(dtype));
    auto h = ck::save(root, {{key, x}}, {.chunk_bytes = 64, .sync = false});
    const NamedSharding cols(line, P(kNone, "x"), true);
    const auto back = ck::load(root, line, {{key, P(kNone, "x")}}, {.step = h.step(), .device = gpu()});
    ASSERT_EQ(back.size(), 1u);
    EXPECT_EQ(back[0].local().device(), gpu()) << key;
    const auto box = cols.index(shape, line.rank());
    Array expected = want;
    for (std::size_t d = 0; d < box.size(); ++d)
      expected = expected.slice(static_cast<int>(d), box[d].start, box[d].stop);
    EXPECT_TRUE(same_bits(back[0].local(), expected.contiguous())) << key;
  }
}

TEST_F(GpuCheckpoint, ABackgroundSaveOfDeviceBlocksKeepsTheValuesOfTheCall) {
  auto world = Communicator::world();
  const SharedTmpDir root;
  const Mesh line = Mesh::line("x", world);
  const Shape shape{3 * line.size() + 2, 5};
  const Array g = test_global(shape, DType::kFloat32);
  ShardedArray x = distribute(g, NamedSharding(line, P("x"), true), 0, gpu());
  auto h = ck::save(root, {{"w", x}}, {.sync = false, .blocking = false});
  Array block = x.local();
  scale(block, 3.0);  // overwritten on the device as soon as save() returns
  h.wait();
  const auto back = ck::load(root, line, {{"w", P()}}, {.device = gpu()});
  EXPECT_EQ(back[0].local().device(), gpu());
  EXPECT_TRUE(same_bits(back[0].local(), g));
}

}  // namespace
}  // namespace shardkit::testing
