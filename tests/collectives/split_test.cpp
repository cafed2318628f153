// Sub-communicators: split(color, key) and dup.

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

TEST(Split, ByParity) {
  Communicator& w = *world();
  const int r = w.rank(), n = w.size();
  auto half = w.split(r % 2, r);
  ASSERT_NE(half, nullptr);
  const int members = (n + 1 - r % 2) / 2;
  EXPECT_EQ(half->size(), members);
  EXPECT_EQ(half->rank(), r / 2);
  // Sum of the world ranks of the members.
  auto [y, t] = half->allreduce(Array::from_values<std::int32_t>({r}), ReduceOp::kSum);
  std::int32_t want = 0;
  for (int q = r % 2; q < n; q += 2) want += q;
  EXPECT_EQ(y.to_vector<std::int32_t>()[0], want);
  EXPECT_NE(half->name().find("split"), std::string::npos);
}

TEST(Split, KeyOrdersRanks) {
  Communicator& w = *world();
  auto reversed = w.split(0, w.size() - 1 - w.rank(), "reversed");
  EXPECT_EQ(reversed->rank(), w.size() - 1 - w.rank());
  EXPECT_EQ(reversed->name(), "reversed");
  // Rank 0 of the new communicator is the last world rank.
  auto [y, t] = reversed->bcast(Array::from_values<std::int32_t>({w.rank()}), 0);
  EXPECT_EQ(y.to_vector<std::int32_t>()[0], w.size() - 1);
}

TEST(Split, NegativeColorGivesNothing) {
  Communicator& w = *world();
  auto only_zero = w.split(w.rank() == 0 ? 0 : -1, 0);
  EXPECT_EQ(only_zero == nullptr, w.rank() != 0);
  if (only_zero) {
    EXPECT_EQ(only_zero->size(), 1);
  }
}

TEST(Split, DupIsIndependentAndNested) {
  Communicator& w = *world();
  auto d = w.dup();
  EXPECT_EQ(d->size(), w.size());
  EXPECT_EQ(d->rank(), w.rank());
  EXPECT_EQ(d->options().check, w.options().check);
  auto nested = d->split(w.rank() < 2 ? 0 : 1, 0)->split(0, 0);
  auto [y, t] = nested->allreduce(Array::from_values<std::int64_t>({1}), ReduceOp::kSum);
  EXPECT_EQ(y.to_vector<std::int64_t>()[0], nested->size());
  // Traffic on the duplicate does not match traffic on the original.
  if (w.size() >= 2 && w.rank() < 2) {
    const int other = 1 - w.rank();
    Array a = Array::from_values<std::int32_t>({10 + w.rank()}), b = Array::from_values<std::int32_t>({20 + w.rank()});
    auto [ra, ta] = w.sendrecv(a, a, other, other, 1, 1);
    auto [rb, tb] = d->sendrecv(b, b, other, other, 1, 1);
    EXPECT_EQ(ra.to_vector<std::int32_t>()[0], 10 + other);
    EXPECT_EQ(rb.to_vector<std::int32_t>()[0], 20 + other);
  }
}

}  // namespace
}  // namespace shardkit::testing
