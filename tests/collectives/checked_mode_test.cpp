// Checked mode: ranks that disagree on a collective raise MismatchError on every rank, naming the fields and the
// ranks, before any data moves; the communicator stays usable afterwards.

#include "checked.hpp"
#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

std::shared_ptr<Communicator> checked() {
  static std::shared_ptr<Communicator> c = [] {
    CommOptions o;
    o.check = true;
    o.name = "checked";
    return Communicator::from_mpi(world()->mpi_handle(), o);
  }();
  return c;
}

// "rank 0", "ranks 1, 2", "ranks 1-3": how the message lists ranks first..last.
std::string ranks(int first, int last) {
  if (first == last) return "rank " + std::to_string(first);
  return "ranks " + std::to_string(first) + (last == first + 1 ? ", " : "-") + std::to_string(last);
}

// Runs `body` (which must raise MismatchError on every rank), compares the whole message with the one expected for
// this rank's operation `op` and the fields that differ (`diff`, in the message's order: operation, sequence number,
// dtype, count, root, reduction, backend, counts), then proves the communicator still works with a correct collective.
template <typename F>
void expect_mismatch(F body, const std::string& op, const std::string& diff) {
  auto c = checked();
  const std::uint64_t seq = c->sequence();
  const std::string want = "ranks disagree on " + op + " #" + std::to_string(seq) +
                           " on communicator 'checked': " + diff +
                           ". Nothing was sent; the communicator is still usable.";
  try {
    body(*c);
    ADD_FAILURE() << "no MismatchError";
  } catch (const MismatchError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_EQ(c->sequence(), seq + 1);
  auto [y, t] = c->allreduce(Array::from_values<std::int32_t>({1}), ReduceOp::kSum);
  EXPECT_EQ(y.to_vector<std::int32_t>()[0], c->size());
}

class CheckedMode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world()->size() == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  }
  int rank() const { return world()->rank(); }
  int last() const { return world()->size() - 1; }
  // "<a> on rank 0, <b> on ranks 1-<last>" and "<a> on ranks 0-<last - 1>, <b> on rank <last>".
  std::string first_differs(const std::string& a, const std::string& b) const {
    return a + " on rank 0, " + b + " on " + ranks(1, last());
  }
  std::string last_differs(const std::string& a, const std::string& b) const {
    return a + " on " + ranks(0, last() - 1) + ", " + b + " on rank " + std::to_string(last());
  }
};

TEST_F(CheckedMode, CountMismatchNamesTheRanks) {
  expect_mismatch(
      [&](Communicator& c) { c.allreduce(Array::zeros({rank() == 0 ? 5 : 6}, DType::kFloat32), ReduceOp::kSum); },
      "allreduce", "count: " + first_differs("5", "6"));
}

TEST_F(CheckedMode, CountMismatchThatMpiAcceptsSilently) {
  // The receivers' buffers are larger than what the root sends. Without checked mode, Open MPI completes such a bcast
  // at 2 ranks without an error (a receive may be longer than its message), leaving the tail of the receive buffer
  // unwritten; at 3 ranks one rank completes silently while another reports a truncation.
  expect_mismatch([&](Communicator& c) { c.bcast(Array::zeros({rank() == 0 ? 5 : 8}, DType::kInt32), 0); }, "bcast",
                  "count: " + first_differs("5", "8"));
}

TEST_F(CheckedMode, DtypeMismatch) {
  expect_mismatch(
      [&](Communicator& c) {
        c.allgather(Array::zeros({4}, rank() == last() ? DType::kFloat64 : DType::kFloat32));
      },
      "allgather", "dtype: " + last_differs("float32", "float64"));
}

TEST_F(CheckedMode, RootMismatch) {
  expect_mismatch([&](Communicator& c) { c.bcast(Array::zeros({3}, DType::kInt32), rank() == 0 ? 0 : last()); },
                  "bcast", "root: " + first_differs("0", std::to_string(last())));
}

TEST_F(CheckedMode, ReductionMismatch) {
  expect_mismatch(
      [&](Communicator& c) {
        c.allreduce(Array::zeros({3}, DType::kInt32), rank() == last() ? ReduceOp::kMax : ReduceOp::kSum);
      },
      "allreduce", "reduction: " + last_differs("sum", "max"));
}

TEST_F(CheckedMode, OrderOfOperationsMismatch) {
  // Rank 0 calls allreduce where the others call bcast: the operation differs, and with it the fields each one has
  // (a root for bcast, a reduction for allreduce). Each rank's message names the operation it called; the values of
  // a field are listed in ascending order ("(none)" first).
  expect_mismatch(
      [&](Communicator& c) {
        Array x = Array::zeros({3}, DType::kInt32);
        if (rank() == 0)
          c.allreduce(x, ReduceOp::kSum);
        else
          c.bcast(x, 0);
      },
      rank() == 0 ? "allreduce" : "bcast",
      "operation: " + first_differs("allreduce", "bcast") + "; root: " + first_differs("(none)", "0") +
          "; reduction: (none) on " + ranks(1, last()) + ", sum on rank 0");
}

TEST_F(CheckedMode, AllgathervCountsMismatch) {
  // Rank 0 believes every rank sends 1 element; the others that rank 1 sends 2. The receive sizes differ, and so do
  // the count arrays (compared by hash).
  const int n = world()->size();
  auto c = checked();
  std::vector<std::int64_t> counts(n, 1);
  if (rank() != 0) counts[1] = 2;
  const std::vector<std::int64_t> theirs = [&] {
    std::vector<std::int64_t> v(n, 1);
    v[1] = 2;
    return v;
  }();
  const auto hash_text = [](std::uint64_t h) { return std::to_string(h); };
  const std::uint64_t mine_hash = detail::hash_counts(std::vector<std::int64_t>(n, 1));
  const std::uint64_t their_hash = detail::hash_counts(theirs);
  // The message lists the values in ascending order as signed 64-bit numbers, and prints them unsigned.
  const bool mine_first = static_cast<std::int64_t>(mine_hash) < static_cast<std::int64_t>(their_hash);
  const std::string hashes =
      mine_first ? first_differs(hash_text(mine_hash), hash_text(their_hash))
                 : hash_text(their_hash) + " on " + ranks(1, last()) + ", " + hash_text(mine_hash) + " on rank 0";
  expect_mismatch(
      [&](Communicator& cc) {
        Array send = Array::zeros({counts[rank()]}, DType::kInt16);
        Array recv = Array::zeros({rank() == 0 ? n : n + 1}, DType::kInt16);
        cc.allgatherv(send, recv, counts);
      },
      "allgatherv", "count: " + first_differs(std::to_string(n), std::to_string(n + 1)) + "; counts (hash): " + hashes);
}

// Rank 0's buffer is on the host (MPI), the others' on their GPU (NCCL): checked mode names the backends. Runs in the
// GPU suite, where NCCL is used (not where ranks share one GPU and every rank stays on MPI).
TEST_F(CheckedMode, BackendMismatch) {
  if (!on_gpu()) GTEST_SKIP() << "needs GPU buffers on the other ranks (the GPU suite)";
  auto c = checked();
  c->allreduce(Array::zeros({2}, DType::kFloat32, buffer_device()), ReduceOp::kSum).token.wait();  // sets NCCL up
  if (c->backend_for(OpKind::kAllreduce, buffer_device()) != BackendKind::kNccl)
    GTEST_SKIP() << "GPU buffers go to MPI here (ranks share a GPU)";
  // Rank 0's host buffers take the host route (shm or MPI, by shm_transport.cpp's table; a host collective on every rank first
  // makes the communicator's collective shm decision); the message lists by name.
  c->allreduce(Array::zeros({4}, DType::kFloat32), ReduceOp::kSum).token.wait();
  const std::string host = backend_name(c->backend_for(OpKind::kAllreduce, Device::cpu()));
  const std::string on0 = host + " on rank 0", others = "nccl on " + ranks(1, last());
  expect_mismatch(
      [&](Communicator& cc) {
        const Device where = rank() == 0 ? Device::cpu() : buffer_device();
        cc.allreduce(Array::zeros({4}, DType::kFloat32, where), ReduceOp::kSum).token.wait();
      },
      "allreduce", "backend: " + (host < "nccl" ? on0 + ", " + others : others + ", " + on0));
}

TEST_F(CheckedMode, AlltoallvCountsMismatch) {
  auto c = checked();
  const int p = c->size();
  std::vector<std::int64_t> send_counts(p, 2), recv_counts(p, 2);
  if (rank() == 0) recv_counts[p - 1] = 3;  // rank 0 expects 3 elements from the last rank, which sends 2
  Array send = Array::zeros({2 * p}, DType::kInt8);
  Array recv = Array::zeros({rank() == 0 ? 2 * p + 1 : 2 * p}, DType::kInt8);
  try {
    c->alltoallv(send, send_counts, recv, recv_counts);
    ADD_FAILURE() << "no MismatchError";
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 0 expect other counts"), std::string::npos) << e.what();
  }
  auto [y, t] = c->allreduce(Array::from_values<std::int32_t>({1}), ReduceOp::kSum);
  EXPECT_EQ(y.to_vector<std::int32_t>()[0], p);
}

TEST_F(CheckedMode, AgreeingRanksPass) {
  auto c = checked();
  auto [y, t] = c->allreduce(Array::from_values<std::int32_t>({rank()}), ReduceOp::kMax);
  EXPECT_EQ(y.to_vector<std::int32_t>()[0], last());
}

}  // namespace
}  // namespace shardkit::testing
