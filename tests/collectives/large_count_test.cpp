// More than 2^31 int8 elements per call through allreduce (chunked) and allgather (point-to-point pieces), with
// the default per-call limit of INT_MAX (label `large`, 2 ranks, about 16 GiB in all). Skipped, on every rank alike,
// when the machine has not that much memory available.

#include <fstream>
#include <string>

#include "collective_test_util.hpp"

namespace shardkit::testing {
namespace {

constexpr std::int64_t kAllreduceCount = (std::int64_t{1} << 31) + 7;  // above INT_MAX on every rank
constexpr std::int64_t kAllgatherPerRank = std::int64_t{INT32_MAX} + 9;  // every rank's part is above INT_MAX

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
std::int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// True on every rank when the node can hold `per_rank` bytes for each rank of the job (with a quarter to spare); the
// ranks agree, so that none enters a collective the others skip.
bool memory_for(Communicator& c, std::int64_t per_rank) {
  const std::int64_t need = per_rank * c.size() / 4 * 5;
  Array ok = Array::from_values<std::int32_t>({available_memory() >= need ? 1 : 0});
  return c.allreduce(ok, ReduceOp::kMin).value.to_vector<std::int32_t>()[0] == 1;
}

TEST(LargeCounts, AllreduceAboveIntMax) {
  Communicator& c = *world();
  if (!memory_for(c, kAllreduceCount))
    GTEST_SKIP() << "needs " << (kAllreduceCount * c.size() >> 20) << " MiB available, MemAvailable is "
                 << (available_memory() >> 20) << " MiB";
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
  const std::int64_t per_rank = kAllgatherPerRank * (1 + c.size());
  if (!memory_for(c, per_rank))
    GTEST_SKIP() << "needs " << (per_rank * c.size() >> 20) << " MiB available, MemAvailable is "
                 << (available_memory() >> 20) << " MiB";
  ASSERT_GT(kAllgatherPerRank, std::int64_t{c.options().max_message_elements}) << "each rank's part must need pieces";
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
