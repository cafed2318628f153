#pragma once

#include <array>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "shardkit/core/float16.hpp"

namespace shardkit {

/// Element types of arrays and collectives (the 15 types of DESIGN.md).
enum class DType : std::uint8_t {
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
};

/// Every dtype, in enum order (handy for test sweeps).
inline constexpr std::array<DType, 15> kAllDTypes = {
    DType::kBool,    DType::kInt8,    DType::kInt16,    DType::kInt32,   DType::kInt64,
    DType::kUInt8,   DType::kUInt16,  DType::kUInt32,   DType::kUInt64,  DType::kFloat16,
    DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kComplex64, DType::kComplex128};

/// Size of one element in bytes.
std::size_t dtype_size(DType dtype) noexcept;
/// Canonical name, as NumPy spells it ("float32", "bfloat16", "bool", ...).
std::string_view dtype_name(DType dtype) noexcept;
/// Parses a name produced by dtype_name. @throws InvalidArgument for an unknown name.
DType dtype_from_name(std::string_view name);

bool is_integer(DType dtype) noexcept;         ///< int8..uint64 (not bool)
bool is_signed_integer(DType dtype) noexcept;  ///< int8..int64
bool is_floating(DType dtype) noexcept;        ///< float16, bfloat16, float32, float64
bool is_complex(DType dtype) noexcept;         ///< complex64, complex128

/// DLPack's description of a type: type code (DLDataTypeCode), bits, lanes.
struct DLPackType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
/// The DLPack type of a dtype.
DLPackType to_dlpack_type(DType dtype) noexcept;
/// The dtype of a DLPack type. @throws InvalidArgument for types shardkit does not support (lanes != 1, float8, ...).
DType from_dlpack_type(DLPackType type);

std::ostream& operator<<(std::ostream& os, DType dtype);


/// The value of a real element as a double: Half and BFloat16 through their float conversions, other types by
/// static_cast.
template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return half_to_float(v);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return bfloat16_to_float(v);
  else
    return static_cast<double>(v);
}

/// Maps a C++ element type to its dtype (bool, the fixed-width integers, Half, BFloat16, float, double,
/// std::complex<float>, std::complex<double>).
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <> struct DTypeOf<std::int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct DTypeOf<std::int16_t> { static constexpr DType value = DType::kInt16; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<std::uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<std::uint16_t> { static constexpr DType value = DType::kUInt16; };
template <> struct DTypeOf<std::uint32_t> { static constexpr DType value = DType::kUInt32; };
template <> struct DTypeOf<std::uint64_t> { static constexpr DType value = DType::kUInt64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<std::complex<float>> { static constexpr DType value = DType::kComplex64; };
template <> struct DTypeOf<std::complex<double>> { static constexpr DType value = DType::kComplex128; };

/// dtype of a C++ type, e.g. `dtype_of<float>` is DType::kFloat32.
template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

/// Calls `f(T{})` with the C++ type that holds one element of `dtype`.
template <typename F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBool: return f(bool{});
    case DType::kInt8: return f(std::int8_t{});
    case DType::kInt16: return f(std::int16_t{});
    case DType::kInt32: return f(std::int32_t{});
    case DType::kInt64: return f(std::int64_t{});
    case DType::kUInt8: return f(std::uint8_t{});
    case DType::kUInt16: return f(std::uint16_t{});
    case DType::kUInt32: return f(std::uint32_t{});
    case DType::kUInt64: return f(std::uint64_t{});
    case DType::kFloat16: return f(Half{});
    case DType::kBFloat16: return f(BFloat16{});
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kComplex64: return f(std::complex<float>{});
    case DType::kComplex128: break;
  }
  return f(std::complex<double>{});
}

}  // namespace shardkit
