// Bad arguments raise InvalidArgument with the offending values before anything is sent: every rank raises, and
// the communicator's sequence number does not move (no rank entered the collective).

#include <atomic>
#include <chrono>
#include <thread>

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

template <typename F>
void expect_invalid(F f, const std::string& fragment) {
  Communicator& c = *world();
  const std::uint64_t seq = c.sequence();
  try {
    f(c);
    ADD_FAILURE() << "no InvalidArgument (expected '" << fragment << "')";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.sequence(), seq) << "an invalid call must not start the collective";
}

TEST(InvalidArguments, RootOutOfRange) {
  const int n = world()->size();
  Array x = Array::zeros({4}, DType::kFloat32);
  expect_invalid([&](Communicator& c) { c.bcast(x, n); }, "root " + std::to_string(n) + " out of range");
  expect_invalid([&](Communicator& c) { c.reduce(x, ReduceOp::kSum, -1); }, "root -1 out of range");
  expect_invalid([&](Communicator& c) { c.gather(x, n + 3); }, "out of range");
  expect_invalid([&](Communicator& c) { c.scatter(x, -2); }, "out of range");
}

TEST(InvalidArguments, MismatchedBufferSizes) {
  const int n = world()->size();
  Array x = Array::zeros({4}, DType::kFloat32);
  Array y = Array::zeros({5}, DType::kFloat32);
  expect_invalid([&](Communicator& c) { c.allreduce(x, y, ReduceOp::kSum); }, "sizes differ");
  Array small = Array::zeros({4 * n - 1}, DType::kFloat32);
  expect_invalid([&](Communicator& c) { c.allgather(x, small); }, "must hold size");
  expect_invalid([&](Communicator& c) { c.reduce_scatter(small, x, ReduceOp::kSum); }, "must hold size");
  if (n > 1) {
    Array odd_send = Array::zeros({n + 1}, DType::kInt8), odd_recv = Array::zeros({n + 1}, DType::kInt8);
    expect_invalid([&](Communicator& c) { c.alltoall(odd_send, odd_recv); }, "equal blocks");
  }
  std::vector<std::int64_t> counts(n, 4);
  expect_invalid([&](Communicator& c) { c.allgatherv(x, small, counts); }, "sum of counts");
  std::vector<std::int64_t> short_counts(n + 1, 4);
  expect_invalid([&](Communicator& c) { c.allgatherv(x, small, short_counts); }, "one entry per rank");
  std::vector<std::int64_t> negative(n, 4);
  negative[0] = -1;
  expect_invalid([&](Communicator& c) { c.alltoallv(x, negative, y, counts); }, "negative send_counts");
  std::vector<std::int64_t> one(n, 1), past_end(n, 0);
  past_end[n - 1] = 4;  // elements 4..4 of a 4-element buffer
  Array recv_n = Array::zeros({n}, DType::kFloat32);
  expect_invalid([&](Communicator& c) {
    c.run(OpKind::kAlltoallv, {.send = &x, .recv = &recv_n, .send_counts = one, .recv_counts = one,
                               .send_displs = past_end});
  }, "lie outside the send buffer");
}

TEST(InvalidArguments, DtypesAndReductions) {
  Array f = Array::zeros({4}, DType::kFloat32), d = Array::zeros({4}, DType::kFloat64);
  expect_invalid([&](Communicator& c) { c.allreduce(f, d, ReduceOp::kSum); }, "send dtype float32 differs");
  expect_invalid([&](Communicator& c) { c.allreduce(Array::zeros({2}, DType::kBool), ReduceOp::kSum); },
                 "'sum' is not defined for dtype bool");
  expect_invalid([&](Communicator& c) { c.allreduce(Array::zeros({2}, DType::kComplex64), ReduceOp::kMax); },
                 "'max' is not defined for dtype complex64");
  expect_invalid([&](Communicator& c) { c.scan(f, ReduceOp::kBitXor); }, "'bxor' is not defined for dtype float32");
}

TEST(InvalidArguments, ReadOnlyReceiveBuffer) {
  std::vector<float> storage(4, 0.0f);
  Array ro = Array::borrow(storage.data(), {4}, DType::kFloat32, Device::cpu(), nullptr, {}, true);
  expect_invalid([&](Communicator& c) { c.allreduce(Array::zeros({4}, DType::kFloat32), ro, ReduceOp::kSum); },
                 "read-only");
  expect_invalid([&](Communicator& c) { c.allreduce_inplace(ro, ReduceOp::kSum); }, "read-only");
}

TEST(InvalidArguments, PeersAndTags) {
  const int n = world()->size();
  Array x = Array::zeros({1}, DType::kInt32);
  expect_invalid([&](Communicator& c) { c.send(x, n); }, "destination " + std::to_string(n) + " out of range");
  expect_invalid([&](Communicator& c) { c.recv(x, n + 1); }, "source");
  expect_invalid([&](Communicator& c) { c.send(x, 0, -5); }, "tag -5 out of range");
  expect_invalid([&](Communicator& c) { c.sendrecv(x, x, 0, -3); }, "destination -3");
}

TEST(InvalidArguments, NegativeCountsAndNullBuffersCannotBeMade) {
  // Arrays are the buffers: a negative count or a null pointer with elements is refused when the buffer is made.
  EXPECT_THROW(Array::empty({-4}, DType::kFloat32), InvalidArgument);
  EXPECT_THROW(Array::borrow(nullptr, {4}, DType::kFloat32, Device::cpu(), nullptr), InvalidArgument);
  EXPECT_NO_THROW(Array::borrow(nullptr, {0}, DType::kFloat32, Device::cpu(), nullptr));
}

// A communicator is used by one thread at a time: an operation from a second thread while the first thread's waits for
// the other ranks is refused before it sends anything (the sequence moves by the first one only), and the first one
// completes. 2-4 ranks (at 1 rank nothing waits); on the default route (shm at 2 ranks here) and on MPI.
TEST(InvalidArguments, ASecondThreadWhileAnOperationRuns) {
  for (BackendKind backend : {BackendKind::kAuto, BackendKind::kMpi}) {
    auto comm = Communicator::world({.backend = backend, .timeout = std::chrono::seconds(30), .name = "two threads"});
    Communicator& c = *comm;
    if (c.size() < 2) GTEST_SKIP() << "needs a rank to wait for";
    const std::uint64_t seq = c.sequence();
    if (c.rank() == 0) {
      std::atomic<bool> started{false};
      std::thread first([&] {
        started = true;
        c.barrier().wait();  // waits for the last rank, which comes late
      });
      while (!started) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      try {
        c.allreduce(Array::zeros({4}, DType::kFloat32), ReduceOp::kSum);
        ADD_FAILURE() << "no InvalidArgument for a second thread";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("allreduce on communicator 'two threads' while another thread's "
                                             "operation runs on it"),
                  std::string::npos)
            << e.what();
      }
      first.join();
    } else {
      if (c.rank() == c.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      c.barrier().wait();
    }
    EXPECT_EQ(c.sequence(), seq + 1) << "only the first thread's barrier ran";
    // Usable again, from this thread.
    Array x = Array::from_values<float>({1.0f, 1.0f, 1.0f});
    c.allreduce_inplace(x, ReduceOp::kSum).wait();
    EXPECT_EQ(x.to_vector<float>(), std::vector<float>(3, static_cast<float>(c.size())));
  }
}

}  // namespace
}  // namespace shardkit::testing
