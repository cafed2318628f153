#pragma once

// float16 and bfloat16 as stored bits, and their conversions to and from float32 (round to nearest, ties to even;
// NaN payloads kept, quiet). Header-only: core's dtypes and the simulated GPU's cuBLAS and NCCL (sim/, which core
// links, so it cannot link core) share this one definition.

#include <cstdint>
#include <cstring>

namespace shardkit {

/// IEEE 754 binary16, stored as its bits. Host conversions round to nearest even.
struct Half {
  std::uint16_t bits = 0;
};
/// bfloat16 (the top half of a float32), stored as its bits. Host conversions round to nearest even.
struct BFloat16 {
  std::uint16_t bits = 0;
};

namespace detail {
// std::bit_cast, which nvcc's C++ dialect for .cu files (this header reaches kernels.cu) may lack.
inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

inline float half_to_float(Half h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN, payload kept
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: normalise into a float32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return detail::bits_float(bits);
}

inline Half float_to_half(float f) noexcept {
  const std::uint32_t x = detail::float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};
    std::uint32_t payload = (abs >> 13) & 0x3ffu;
    return {static_cast<std::uint16_t>(sign | 0x7c00u | (payload ? payload : 0x200u))};
  }
  if (abs >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: overflow
  if (abs >= 0x38800000u) {                                                     // normal half
    const std::uint32_t mant_odd = (abs >> 13) & 1u;
    const std::uint32_t rounded = abs + 0xfffu + mant_odd;  // round to nearest even at bit 13
    return {static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
  }
  if (abs < 0x33000000u) return {sign};  // below half the smallest subnormal: zero
  // Subnormal half: shift the implicit-one mantissa into place with round to nearest even.
  const std::uint32_t exp = abs >> 23;
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - exp;  // 14..24
  std::uint32_t result = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1);
  const std::uint32_t half_way = 1u << (shift - 1);
  if (rem > half_way || (rem == half_way && (result & 1u))) ++result;
  return {static_cast<std::uint16_t>(sign | result)};
}

inline float bfloat16_to_float(BFloat16 b) noexcept {
  return detail::bits_float(static_cast<std::uint32_t>(b.bits) << 16);
}

inline BFloat16 float_to_bfloat16(float f) noexcept {
  const std::uint32_t x = detail::float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the top payload bits, force a non-zero mantissa so it stays NaN.
    std::uint16_t hi = static_cast<std::uint16_t>(x >> 16);
    return {static_cast<std::uint16_t>((hi & 0x7fu) ? hi : (hi | 0x40u))};
  }
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return {static_cast<std::uint16_t>(rounded >> 16)};
}

}  // namespace shardkit
