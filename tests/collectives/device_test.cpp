// NCCL operations and the caller's CUDA device: an operation sets its communicator's device for its own calls and
// gives the caller's current device back.

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "collective_test_util.hpp"
#include "backends/mpi/staging.hpp"
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

// Point-to-point on GPU buffers needs only the ranks that exchange. A communicator that did not agree on NCCL when it
// was made (here, the caller's, wrapped) must not start that agreement, which is collective, from a send or a receive:
// they take MPI. Before, ranks 0 and 1 waited in it for the others (a timeout in the communicator's set-up, or a hang).
TEST(NcclDevice, PointToPointOnAWrappedCommunicatorNeedsOnlyItsPeers) {
  if (!on_gpu()) GTEST_SKIP() << "GPU suite only (SHARDKIT_TEST_BUFFERS=cuda)";
  if (world()->size() < 2) GTEST_SKIP() << "needs two ranks";
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  {
    CommOptions o;
    o.name = "p2p-only";
    o.timeout = std::chrono::seconds(20);
    auto c = Communicator::wrap_mpi(from_mpi(dup), o);
    const Device gpu = runtime().device();
    if (c->rank() == 0) c->send(Array::arange(100, DType::kFloat32, gpu), 1, 5).wait();
    if (c->rank() == 1) {
      Array got = Array::empty({100}, DType::kFloat32, gpu);
      c->recv_into(got, 0, 5).wait();
      EXPECT_EQ(got.to(Device::cpu()).to_vector<float>()[99], 99.0f);
    }
    EXPECT_EQ(c->backend_for(OpKind::kSend, gpu), BackendKind::kMpi);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&dup);
}

// Every rank takes part in the NCCL decision of a communicator it makes, with or without a GPU: where only some ranks
// have one (run so on the simulated GPU: collectives_mixed_devices), the ranks agree on MPI and the GPU ranks' device
// buffers are staged. Before, the ranks without a GPU skipped the decision and the others waited for them in it.
TEST(MixedDevices, WorldMadeWhereOnlySomeRanksHaveAGpu) {
  const Device mine = runtime().device();
  int has = mine.kind == DeviceKind::kCUDA ? 1 : 0, all = 0, any = 0;
  MPI_Allreduce(&has, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&has, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  auto c = Communicator::world({.timeout = std::chrono::seconds(20), .name = "mixed"});
  if (!all) {
    EXPECT_FALSE(c->has_nccl());
  }
  const Array x = Array::arange(10, DType::kFloat32, mine);
  auto [y, t] = c->allreduce(x, ReduceOp::kSum);
  t.wait();
  EXPECT_EQ(y.device(), mine);
  EXPECT_EQ(y.to(Device::cpu()).to_vector<float>()[9], 9.0f * static_cast<float>(c->size()));
  if (std::getenv("SHARDKIT_TEST_EXPECT_MIXED")) {
    EXPECT_TRUE(any && !all) << "expected a mixed job";
  }
}

// A buffer on another GPU than the communicator's: refused before anything is sent (NCCL would fault or fail).
TEST(NcclDevice, BufferOnAnotherDeviceIsRefused) {
  if (!on_gpu()) GTEST_SKIP() << "GPU suite only (SHARDKIT_TEST_BUFFERS=cuda)";
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";  // a limit of this machine, not a missing GPU
  auto c = world();
  if (!c->has_nccl()) GTEST_SKIP() << "no NCCL communicator";
  const Device other = Device::cuda((runtime().device().index + 1) % cuda::device_count());
  const Array x = Array::arange(8, DType::kFloat32, other);
  try {
    c->allreduce(x, ReduceOp::kSum);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("runs NCCL on cuda:"), std::string::npos) << e.what();
  }
}

// NCCL still enqueueing an operation (ncclInProgress for good: SHARDKIT_SIM_NCCL_ENQUEUE_STALL=1 on the simulated GPU)
// must not hold the caller past the timeout: TimeoutError, the communicator aborted, the job ended at exit (the ctest
// entry collectives_nccl_settle_timeout checks the line this prints and the exit).
TEST(NcclSettle, StuckEnqueueTimesOut) {
  if (!std::getenv("SHARDKIT_SIM_NCCL_ENQUEUE_STALL")) GTEST_SKIP() << "run by collectives_nccl_settle_timeout";
  auto c = Communicator::world({.timeout = std::chrono::seconds(1), .name = "settle"});
  ASSERT_TRUE(c->has_nccl());
  const Array x = Array::arange(8, DType::kFloat32, runtime().device());
  const auto start = std::chrono::steady_clock::now();
  try {
    c->allreduce(x, ReduceOp::kSum);
    ADD_FAILURE() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("settle: TimeoutError after %.1f s: %s\n", s, e.what());
    EXPECT_LT(s, 5.0);
  }
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
