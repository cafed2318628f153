// NCCL operations and the caller's CUDA device: an operation sets its communicator's device for its own calls and
// gives the caller's current device back.

#include "collective_test_util.hpp"
#include "mpi/staging.hpp"
#include "shardkit/core/cuda.hpp"

namespace shardkit::testing {
namespace {

TEST(NcclDevice, OperationsLeaveTheCallersCurrentDevice) {
  if (!on_gpu()) GTEST_SKIP() << "GPU suite only (SHARDKIT_TEST_BUFFERS=cuda)";
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";  // a limit of this machine, not a missing GPU
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

// The pinned staging pool reuses blocks but holds at most its cap idle: one large message must not pin its size class
// for the rest of the run.
TEST(StagingPool, ReusesBlocksAndCapsWhatItKeeps) {
  if (!on_gpu()) GTEST_SKIP() << "GPU suite only (SHARDKIT_TEST_BUFFERS=cuda)";
  const std::size_t old_cap = detail::set_pinned_pool_cap(std::size_t{1} << 20);
  const Array small = Array::empty({1000}, DType::kFloat32);  // 4000 bytes: the 4 KiB class
  detail::pinned_like(small);                                  // allocated (or reused), then back in the pool
  const std::size_t after_first = detail::pinned_blocks_allocated();
  detail::pinned_like(small);
  EXPECT_EQ(detail::pinned_blocks_allocated(), after_first);  // reused
  EXPECT_LE(detail::pinned_idle_bytes(), std::size_t{1} << 20);
  { Array big = detail::pinned_like(Array::empty({std::int64_t{1} << 20}, DType::kFloat32)); }  // 4 MiB > cap
  EXPECT_LE(detail::pinned_idle_bytes(), std::size_t{1} << 20);
  detail::set_pinned_pool_cap(0);
  EXPECT_EQ(detail::pinned_idle_bytes(), 0u);
  detail::set_pinned_pool_cap(old_cap);
}

}  // namespace
}  // namespace shardkit::testing
