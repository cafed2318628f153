#pragma once
// Helpers of the checkpoint tests: a directory every rank shares, the deterministic contents of a saved array (the
// same formula as test_readers.py's), sub-communicators standing for jobs of fewer ranks, and the checks both test
// files make (bytes each rank wrote, a flipped byte, the error a call raises).

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "shardkit/checkpoint/checkpoint.hpp"
#include "shardkit/sharding/sharding.hpp"

namespace shardkit::testing {

/// Byte `b` of element `i` (global row-major index) of a test array: every dtype but bool takes these bytes as they
/// come (any bit pattern, NaN payloads included, compared bit for bit); bool elements are 1 when i % 3 == 0.
inline unsigned char test_byte(DType dtype, std::int64_t i, std::size_t b) {
  if (dtype == DType::kBool) return i % 3 == 0 ? 1 : 0;
  return static_cast<unsigned char>((i * 131 + static_cast<std::int64_t>(b) * 31 + 7) & 0xFF);
}

/// The global test array of a shape and dtype.
inline Array test_global(const Shape& shape, DType dtype) {
  Array a = Array::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(a.data());
  const std::size_t isz = dtype_size(dtype);
  for (std::int64_t i = 0; i < a.numel(); ++i)
    for (std::size_t b = 0; b < isz; ++b) p[static_cast<std::size_t>(i) * isz + b] = test_byte(dtype, i, b);
  return a;
}

/// The block `rank` holds of the test array under `sharding` (what distribute() gives it).
inline Array test_block(const Shape& shape, DType dtype, const NamedSharding& sharding, int rank) {
  Array g = test_global(shape, dtype);
  const auto box = sharding.index(shape, rank);
  Array v = g;
  for (std::size_t d = 0; d < box.size(); ++d) v = v.slice(static_cast<int>(d), box[d].start, box[d].stop);
  return v.contiguous();
}

/// True when two arrays have the same shape, dtype and bytes.
inline ::testing::AssertionResult same_bits(const Array& a, const Array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.describe() << " vs " << b.describe();
  Array ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  if (ha.nbytes() > 0 && std::memcmp(ha.data(), hb.data(), ha.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes differ: " << a.describe();
  return ::testing::AssertionSuccess();
}

/// A fresh directory every rank of the world names alike (made by rank 0 under TMPDIR or /tmp, removed by it at the
/// end of the test, after every rank is done with it).
class SharedTmpDir {
 public:
  SharedTmpDir() {
    auto world = Communicator::world();
    std::string path;
    if (world->rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::string tmpl = std::string(base && *base ? base : "/tmp") + "/shardkit-ckpt-test-XXXXXX";
      SHARDKIT_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
      path = tmpl;
    }
    Array buf = Array::zeros({512}, DType::kUInt8);
    if (world->rank() == 0) std::memcpy(buf.data(), path.data(), path.size());
    world->bcast_inplace(buf, 0).wait();
    path_ = static_cast<const char*>(buf.data());
  }
  SharedTmpDir(const SharedTmpDir&) = delete;
  SharedTmpDir& operator=(const SharedTmpDir&) = delete;
  ~SharedTmpDir() {
    try {
      auto world = Communicator::world();
      world->barrier().wait();
      if (world->rank() == 0) std::filesystem::remove_all(path_);
    } catch (...) {
    }
  }
  const std::string& path() const noexcept { return path_; }
  operator const std::string&() const noexcept { return path_; }  // NOLINT(google-explicit-constructor)

 private:
  std::string path_;
};

/// Ranks 0..n-1 of the world as one communicator (nullptr on the other ranks): a job of n ranks.
inline std::shared_ptr<Communicator> first_ranks(int n) {
  auto world = Communicator::world();
  const bool in = world->rank() < n;
  auto c = world->split(in ? 0 : 1, world->rank(), "first " + std::to_string(n));
  return in ? c : nullptr;
}

/// Every rank's bytes_written of a save.
inline std::vector<std::int64_t> written_by(const checkpoint::SaveHandle& h, Communicator& comm) {
  Result r = comm.allgather(Array::from_values<std::int64_t>({static_cast<std::int64_t>(h.bytes_written())}));
  r.token.wait();
  return r.value.to_vector<std::int64_t>();
}

/// Flips one bit of the byte at `offset_from_end` from the file's end (`from_end`) or start.
inline void flip_byte(const std::string& path, std::int64_t offset_from_end, bool from_end) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  struct stat st {};
  ::fstat(fd, &st);
  const off_t at = from_end ? st.st_size - offset_from_end : offset_from_end;
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, at), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
  ::close(fd);
}

/// The message of the shardkit error `f` raises ("" when none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// `f` raises an E whose message holds `needle`.
template <typename E>
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace shardkit::testing
