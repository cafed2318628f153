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

}  // namespace shardkit
