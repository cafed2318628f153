// Checked mode: ranks that disagree on a collective raise MismatchError on every rank, naming the fields and the
// ranks, before any data moves; the communicator stays usable afterwards.

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

// Runs `body` (which must raise MismatchError on every rank), checks the message, then proves the communicator
// still works with a correct collective.
template <typename F>
void expect_mismatch(F body, std::vector<std::string> fragments) {
  auto c = checked();
  const std::uint64_t seq = c->sequence();
  try {
    body(*c);
    ADD_FAILURE() << "no MismatchError";
  } catch (const MismatchError& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
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
};

TEST_F(CheckedMode, CountMismatchNamesTheRanks) {
  expect_mismatch(
      [&](Communicator& c) { c.allreduce(Array::zeros({rank() == 0 ? 5 : 6}, DType::kFloat32), ReduceOp::kSum); },
      {"MismatchError", "allreduce", "count: 5 on rank 0, 6 on rank", "still usable"});
}

TEST_F(CheckedMode, DtypeMismatch) {
  expect_mismatch(
      [&](Communicator& c) {
        c.allgather(Array::zeros({4}, rank() == last() ? DType::kFloat64 : DType::kFloat32));
      },
      {"dtype: float32 on rank", "float64 on rank " + std::to_string(last())});
}

TEST_F(CheckedMode, RootMismatch) {
  expect_mismatch([&](Communicator& c) { c.bcast(Array::zeros({3}, DType::kInt32), rank() == 0 ? 0 : last()); },
                  {"root: 0 on rank 0", std::to_string(last()) + " on rank"});
}

TEST_F(CheckedMode, ReductionMismatch) {
  expect_mismatch(
      [&](Communicator& c) {
        c.allreduce(Array::zeros({3}, DType::kInt32), rank() == last() ? ReduceOp::kMax : ReduceOp::kSum);
      },
      {"reduction: sum on rank", "max on rank " + std::to_string(last())});
}

TEST_F(CheckedMode, OrderOfOperationsMismatch) {
  // Rank 0 calls allreduce where the others call bcast.
  expect_mismatch(
      [&](Communicator& c) {
        Array x = Array::zeros({3}, DType::kInt32);
        if (rank() == 0)
          c.allreduce(x, ReduceOp::kSum);
        else
          c.bcast(x, 0);
      },
      {"operation: allreduce on rank 0", "bcast on rank"});
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
