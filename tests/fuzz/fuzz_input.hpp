#pragma once

// Reads fixed-width little-endian fields from the front of a fuzzer input. Past the end every field reads as zero,
// so any input decodes, and a seed is just its fields written out in order (see README.md here).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace shardkit::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  template <typename T>
  T read() {
    static_assert(std::is_integral_v<T>);
    std::make_unsigned_t<T> v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      const std::uint8_t b = pos_ < size_ ? data_[pos_++] : 0;
      v |= static_cast<std::make_unsigned_t<T>>(static_cast<std::make_unsigned_t<T>>(b) << (8 * i));
    }
    return static_cast<T>(v);
  }
  std::uint8_t u8() { return read<std::uint8_t>(); }
  std::uint16_t u16() { return read<std::uint16_t>(); }
  std::uint32_t u32() { return read<std::uint32_t>(); }
  std::uint64_t u64() { return read<std::uint64_t>(); }
  std::int8_t i8() { return read<std::int8_t>(); }
  std::int32_t i32() { return read<std::int32_t>(); }
  std::int64_t i64() { return read<std::int64_t>(); }

  /// The bytes up to the next '\n' (not included), or to the end.
  std::string_view line() {
    const std::size_t start = pos_;
    while (pos_ < size_ && data_[pos_] != '\n') ++pos_;
    std::string_view s(reinterpret_cast<const char*>(data_) + start, pos_ - start);
    if (pos_ < size_) ++pos_;
    return s;
  }
  bool empty() const noexcept { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace shardkit::fuzz

/// A property of the library that must hold: on violation, print it and abort (libFuzzer reports a crash and saves
/// the input).
#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
