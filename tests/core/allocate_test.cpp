// Host storage behind Array::empty: small buffers from the heap, large ones from their own huge-page-aligned mapping.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "shardkit/core/array.hpp"

namespace shardkit {
namespace {

TEST(Allocate, SmallHostBuffersAreCacheLineAligned) {
  for (std::int64_t n : {0, 1, 63, 65, 4096}) {
    Array a = Array::empty({n}, DType::kUInt8);
    EXPECT_NE(a.data(), nullptr) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 64, 0u) << n;
  }
}

TEST(Allocate, LargeHostBuffersAreHugePageAlignedAndWritable) {
  const std::int64_t n = (std::int64_t{32} << 20) + 3;  // past the threshold, not a whole number of huge pages
  Array a = Array::empty({n}, DType::kUInt8);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % (std::uintptr_t{2} << 20), 0u);
  auto* p = static_cast<unsigned char*>(a.data());
  std::memset(p, 0xab, static_cast<std::size_t>(n));
  EXPECT_EQ(p[0], 0xab);
  EXPECT_EQ(p[n - 1], 0xab);
}

}  // namespace
}  // namespace shardkit
