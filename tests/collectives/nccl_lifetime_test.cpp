// Lifetimes around pending NCCL work (GPU suite): what the caller drops while an operation is still in flight must
// neither block the host on it nor free memory the operation still uses.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

Array filled(float v, std::int64_t n, Device dev) {
  return Array::from_values<float>(std::vector<float>(static_cast<std::size_t>(n), v)).to(dev);
}

// Rank 0 drops every handle to an operation (token, input, result) while its peers have not yet posted it, issues
// a second one, then tells the peers to go on through a plain MPI message. The peers post both operations only after
// that message (nothing in the operation itself waits for them: unchecked, as in an MPI nonblocking collective).
// If dropping the first operation's buffers blocked rank 0 until the operation completed (a device
// free synchronises the device), the message would never come: the peers report it rather than hang.
TEST(NcclLifetime, DroppingBuffersWithWorkPendingDoesNotBlock) {
  SHARDKIT_SKIP_IF_GPU_SUITE_WITHOUT_GPU();
  if (!on_gpu()) GTEST_SKIP() << "GPU suite only (SHARDKIT_TEST_BUFFERS=cuda)";
  CommOptions o;
  o.check = false;  // checked mode exchanges each operation's signature first: rank 0 would wait for its peers there
  o.name = "lifetime";
  auto comm = Communicator::world(o);
  const int n = comm->size();
  if (n < 2) GTEST_SKIP() << "needs a peer that has not yet posted the operation";
  const Device dev = buffer_device();
  if (comm->backend_for(OpKind::kAllreduce, dev) != BackendKind::kNccl)
    GTEST_SKIP() << "device buffers go to MPI here (ranks share a GPU): its operations wait for their peers";
  const int kGo = 4711;
  constexpr std::int64_t kCount = 1000;
  MPI_Comm side;
  MPI_Comm_dup(MPI_COMM_WORLD, &side);
  if (comm->rank() == 0) {
    {
      auto [y, t] = comm->allreduce(filled(1.0f, kCount, dev), ReduceOp::kSum);
    }  // token, input and result dropped with the operation in flight
    auto [y2, t2] = comm->allreduce(filled(2.0f, kCount, dev), ReduceOp::kSum);
    for (int r = 1; r < n; ++r) MPI_Send(&kGo, 1, MPI_INT, r, 0, side);
    t2.wait();
    EXPECT_EQ(y2.to_vector<float>(), std::vector<float>(kCount, 2.0f * n));
  } else {
    int go = 0;
    MPI_Request req;
    MPI_Irecv(&go, 1, MPI_INT, 0, 0, side, &req);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int done = 0; !done;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done && std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %d: rank 0 blocked after dropping buffers with NCCL work pending\n", comm->rank());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);  // rank 0 cannot take part in anything else: end the job, failed
      }
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    auto [y, t] = comm->allreduce(filled(1.0f, kCount, dev), ReduceOp::kSum);
    auto [y2, t2] = comm->allreduce(filled(2.0f, kCount, dev), ReduceOp::kSum);
    EXPECT_EQ(y.to_vector<float>(), std::vector<float>(kCount, 1.0f * n));  // the dropped operation still ran
    EXPECT_EQ(y2.to_vector<float>(), std::vector<float>(kCount, 2.0f * n));
  }
  MPI_Comm_free(&side);
  comm->barrier();
}

}  // namespace
}  // namespace shardkit::testing
