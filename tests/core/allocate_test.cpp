// Host storage behind Array::empty: small buffers from the heap, large ones from their own huge-page-aligned mapping,
// kept for reuse once freed.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "allocate.hpp"
#include "shardkit/core/array.hpp"

namespace shardkit {
namespace {

constexpr auto kLarge = static_cast<std::int64_t>(detail::kLargeHostBytes);
constexpr std::int64_t kMiB = std::int64_t{1} << 20;

TEST(Allocate, SmallHostBuffersAreCacheLineAligned) {
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{63}, std::int64_t{65}, std::int64_t{4096},
                         kLarge - 1}) {
    Array a = Array::empty({n}, DType::kUInt8);
    EXPECT_NE(a.data(), nullptr) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 64, 0u) << n;
  }
}

TEST(Allocate, LargeHostBuffersAreHugePageAlignedAndWritable) {
  // From the threshold on, whole numbers of huge pages or not.
  for (std::int64_t n : {kLarge, kLarge + 3, (std::int64_t{32} << 20) + 3}) {
    Array a = Array::empty({n}, DType::kUInt8);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % (std::uintptr_t{2} << 20), 0u) << n;
    auto* p = static_cast<unsigned char*>(a.data());
    std::memset(p, 0xab, static_cast<std::size_t>(n));
    EXPECT_EQ(p[0], 0xab) << n;
    EXPECT_EQ(p[n - 1], 0xab) << n;
  }
}

// A freed large buffer is reused by the next allocation of its size (or up to an eighth less), never by a larger one,
// a much smaller one, or while it is still in use.
TEST(Allocate, FreedLargeHostBuffersAreReusedWhole) {
  if (!detail::kKeepFreedHostBuffers) GTEST_SKIP() << "none are kept under AddressSanitizer";
  const void* first = nullptr;
  {
    Array a = Array::empty({3 * kMiB}, DType::kUInt8);
    first = a.data();
    std::memset(a.data(), 1, static_cast<std::size_t>(3 * kMiB));
  }
  const void* second = nullptr;
  {
    Array same = Array::empty({3 * kMiB - 4096}, DType::kUInt8);
    EXPECT_EQ(same.data(), first);
    Array another = Array::empty({3 * kMiB}, DType::kUInt8);  // the kept one is in use
    EXPECT_NE(another.data(), first);
    second = another.data();
    std::memset(same.data(), 2, static_cast<std::size_t>(3 * kMiB - 4096));  // whole and writable
    std::memset(another.data(), 3, static_cast<std::size_t>(3 * kMiB));
    EXPECT_EQ(static_cast<const unsigned char*>(another.data())[0], 3);
  }
  for (std::int64_t n : {3 * kMiB + 1, 2 * kMiB}) {  // larger, or more than an eighth smaller: a mapping of its own
    Array b = Array::empty({n}, DType::kUInt8);
    EXPECT_NE(b.data(), first) << n;
    EXPECT_NE(b.data(), second) << n;
  }
  Array again = Array::empty({3 * kMiB}, DType::kUInt8);
  EXPECT_TRUE(again.data() == first || again.data() == second);
}

// Threads that make and free large arrays of a few sizes at once never get one buffer twice: each fills its array with
// its own byte and finds it unchanged after the others had their turns.
TEST(Allocate, ThreadsNeverShareAKeptHostBuffer) {
  constexpr int kThreads = 4;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < 50; ++i) {
        const std::int64_t n = (2 + (i + t) % 3) * kMiB;
        Array a = Array::empty({n}, DType::kUInt8);
        auto* p = static_cast<unsigned char*>(a.data());
        const auto mark = static_cast<unsigned char>(t + 1);
        std::memset(p, mark, static_cast<std::size_t>(n));
        std::this_thread::yield();
        for (std::int64_t j = 0; j < n; j += 4096) wrong[t] += p[j] != mark;
        wrong[t] += p[n - 1] != mark;
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}

// What is kept stays within kCachedHostBytes, whatever is freed; the newest are kept.
TEST(Allocate, KeptHostBuffersStayWithinTheirBound) {
  if (!detail::kKeepFreedHostBuffers) GTEST_SKIP() << "none are kept under AddressSanitizer";
  constexpr auto kBound = static_cast<std::int64_t>(detail::kCachedHostBytes);
  const std::int64_t n = kBound / 4 + kMiB;  // three fit, four do not (untouched: no memory is used)
  std::vector<const void*> made;
  {
    std::vector<Array> live;
    for (int i = 0; i < 5; ++i) {
      live.push_back(Array::empty({n}, DType::kUInt8));
      made.push_back(live.back().data());
    }
  }  // freed in order: the first two go
  EXPECT_LE(detail::cached_host_bytes(), detail::kCachedHostBytes);
  EXPECT_GE(detail::cached_host_bytes(), static_cast<std::size_t>(3 * n));
  std::vector<Array> reused;
  for (int i = 0; i < 3; ++i) reused.push_back(Array::empty({n}, DType::kUInt8));
  for (const Array& a : reused)
    EXPECT_TRUE(a.data() == made[2] || a.data() == made[3] || a.data() == made[4]);
  // Larger than the bound alone: never kept.
  const std::size_t before = detail::cached_host_bytes();
  { Array huge = Array::empty({kBound + kMiB}, DType::kUInt8); }
  EXPECT_EQ(detail::cached_host_bytes(), before);
}

}  // namespace
}  // namespace shardkit
