// NCCL operations and the caller's CUDA device: an operation sets its communicator's device for its own calls and
// gives the caller's current device back.

#include "collective_test_util.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit::testing {
namespace {

TEST(NcclDevice, OperationsLeaveTheCallersCurrentDevice) {
  if (!on_gpu()) GTEST_SKIP() << "GPU suite only (SHARDKIT_TEST_BUFFERS=cuda)";
  if (cuda::device_count() < 2) SHARDKIT_GPU_SKIP("needs two GPUs");
  const int mine = runtime().device().index;
  const int other = (mine + 1) % cuda::device_count();
  Array x = Array::arange(64, DType::kFloat32, runtime().device());
  cuda::set_device(other);
  auto [y, t] = world()->allreduce(x, ReduceOp::kSum);
  t.wait();
  EXPECT_EQ(cuda::current_device(), other);
  cuda::set_device(mine);
  EXPECT_EQ(y.to(Device::cpu()).to_vector<float>()[3], 3.0f * static_cast<float>(world()->size()));
}

}  // namespace
}  // namespace shardkit::testing
