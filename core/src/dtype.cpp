#include "shardkit/core/dtype.hpp"

#include <bit>
#include <cstring>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

// DLDataTypeCode values of the DLPack spec (kept here so this file needs no DLPack header).
constexpr std::uint8_t kDLInt = 0;
constexpr std::uint8_t kDLUInt = 1;
constexpr std::uint8_t kDLFloat = 2;
constexpr std::uint8_t kDLBfloat = 4;
constexpr std::uint8_t kDLComplex = 5;
constexpr std::uint8_t kDLBool = 6;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
  DLPackType dl;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kBool, "bool", 1, {kDLBool, 8, 1}},
    {DType::kInt8, "int8", 1, {kDLInt, 8, 1}},
    {DType::kInt16, "int16", 2, {kDLInt, 16, 1}},
    {DType::kInt32, "int32", 4, {kDLInt, 32, 1}},
    {DType::kInt64, "int64", 8, {kDLInt, 64, 1}},
    {DType::kUInt8, "uint8", 1, {kDLUInt, 8, 1}},
    {DType::kUInt16, "uint16", 2, {kDLUInt, 16, 1}},
    {DType::kUInt32, "uint32", 4, {kDLUInt, 32, 1}},
    {DType::kUInt64, "uint64", 8, {kDLUInt, 64, 1}},
    {DType::kFloat16, "float16", 2, {kDLFloat, 16, 1}},
    {DType::kBFloat16, "bfloat16", 2, {kDLBfloat, 16, 1}},
    {DType::kFloat32, "float32", 4, {kDLFloat, 32, 1}},
    {DType::kFloat64, "float64", 8, {kDLFloat, 64, 1}},
    {DType::kComplex64, "complex64", 8, {kDLComplex, 64, 1}},
    {DType::kComplex128, "complex128", 16, {kDLComplex, 128, 1}},
};
static_assert(std::size(kInfo) == kAllDTypes.size());

const DTypeInfo& info(DType dtype) noexcept { return kInfo[static_cast<std::size_t>(dtype)]; }

}  // namespace

std::size_t dtype_size(DType dtype) noexcept { return info(dtype).size; }
std::string_view dtype_name(DType dtype) noexcept { return info(dtype).name; }

DType dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.dtype;
  throw InvalidArgument(detail::concat("unknown dtype '", name, "'"));
}

bool is_integer(DType d) noexcept { return d >= DType::kInt8 && d <= DType::kUInt64; }
bool is_signed_integer(DType d) noexcept { return d >= DType::kInt8 && d <= DType::kInt64; }
bool is_floating(DType d) noexcept { return d >= DType::kFloat16 && d <= DType::kFloat64; }
bool is_complex(DType d) noexcept { return d == DType::kComplex64 || d == DType::kComplex128; }

DLPackType to_dlpack_type(DType dtype) noexcept { return info(dtype).dl; }

DType from_dlpack_type(DLPackType type) {
  if (type.lanes != 1)
    throw InvalidArgument(detail::concat("unsupported DLPack dtype: lanes=", type.lanes, " (only scalar types)"));
  for (const auto& i : kInfo)
    if (i.dl.code == type.code && i.dl.bits == type.bits) return i.dtype;
  // Some producers describe bool as an 8-bit unsigned integer of code kDLBool only; others use kDLUInt with 1 bit.
  throw InvalidArgument(detail::concat("unsupported DLPack dtype: code=", static_cast<int>(type.code),
                                       " bits=", static_cast<int>(type.bits)));
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

// ---- float16 / bfloat16 --------------------------------------------------------------------------------------

float half_to_float(Half h) noexcept {
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
  return std::bit_cast<float>(bits);
}

Half float_to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
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

float bfloat16_to_float(BFloat16 b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16); }

BFloat16 float_to_bfloat16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the top payload bits, force a non-zero mantissa so it stays NaN.
    std::uint16_t hi = static_cast<std::uint16_t>(x >> 16);
    return {static_cast<std::uint16_t>((hi & 0x7fu) ? hi : (hi | 0x40u))};
  }
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return {static_cast<std::uint16_t>(rounded >> 16)};
}

}  // namespace shardkit
