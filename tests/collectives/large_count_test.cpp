// More than 2^31 int8 elements through allreduce and allgather (label `large`, 2 ranks, about 6 GiB in all).

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

constexpr std::int64_t kAllreduceCount = (std::int64_t{1} << 31) + 7;  // above INT_MAX on every rank
constexpr std::int64_t kAllgatherPerRank = (std::int64_t{1} << 30) + 1;  // the result exceeds 2^31 at 2 ranks

TEST(LargeCounts, AllreduceAboveIntMax) {
  Communicator& c = *world();
  Array buf = Array::empty({kAllreduceCount}, DType::kInt8);
  auto* p = buf.data_as<std::int8_t>();
  for (std::int64_t i = 0; i < kAllreduceCount; ++i) p[i] = static_cast<std::int8_t>((i + c.rank()) % 50);
  c.allreduce_inplace(buf, ReduceOp::kSum).wait();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < kAllreduceCount; ++i) {
    std::int64_t want = 0;
    for (int r = 0; r < c.size(); ++r) want += (i + r) % 50;
    bad += p[i] != static_cast<std::int8_t>(want);
  }
  EXPECT_EQ(bad, 0);
}

TEST(LargeCounts, AllgatherAboveIntMax) {
  Communicator& c = *world();
  Array send = Array::empty({kAllgatherPerRank}, DType::kInt8);
  auto* s = send.data_as<std::int8_t>();
  for (std::int64_t i = 0; i < kAllgatherPerRank; ++i) s[i] = static_cast<std::int8_t>((i * 3 + c.rank() * 7) % 101);
  Array recv = Array::empty({kAllgatherPerRank * c.size()}, DType::kInt8);
  c.allgather(send, recv).wait();
  send = Array();
  const auto* g = recv.data_as<std::int8_t>();
  std::int64_t bad = 0;
  for (int r = 0; r < c.size(); ++r)
    for (std::int64_t i = 0; i < kAllgatherPerRank; ++i)
      bad += g[r * kAllgatherPerRank + i] != static_cast<std::int8_t>((i * 3 + r * 7) % 101);
  EXPECT_EQ(bad, 0);
  EXPECT_GT(recv.numel(), std::int64_t{INT32_MAX});
}

}  // namespace
}  // namespace shardkit::testing
