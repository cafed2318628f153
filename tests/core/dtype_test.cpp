#include "shardkit/core/dtype.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(kAllDTypes.size(), 15u);
  const std::size_t sizes[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16};
  for (std::size_t i = 0; i < kAllDTypes.size(); ++i) {
    const DType d = kAllDTypes[i];
    EXPECT_EQ(dtype_size(d), sizes[i]) << dtype_name(d);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_THROW(dtype_from_name("float8"), InvalidArgument);
}

TEST(DType, Categories) {
  EXPECT_TRUE(is_integer(DType::kUInt64));
  EXPECT_FALSE(is_integer(DType::kBool));
  EXPECT_TRUE(is_signed_integer(DType::kInt16));
  EXPECT_FALSE(is_signed_integer(DType::kUInt16));
  EXPECT_TRUE(is_floating(DType::kBFloat16));
  EXPECT_FALSE(is_floating(DType::kComplex64));
  EXPECT_TRUE(is_complex(DType::kComplex128));
}

TEST(DType, DLPackTypesRoundTrip) {
  for (DType d : kAllDTypes) {
    const DLPackType t = to_dlpack_type(d);
    EXPECT_EQ(t.lanes, 1);
    EXPECT_EQ(t.bits, dtype_size(d) * 8);
    EXPECT_EQ(from_dlpack_type(t), d);
  }
  EXPECT_THROW(from_dlpack_type({2, 32, 4}), InvalidArgument);  // vector lanes
  EXPECT_THROW(from_dlpack_type({7, 8, 1}), InvalidArgument);   // float8
  EXPECT_THROW(from_dlpack_type({0, 128, 1}), InvalidArgument); // int128
}

TEST(DType, CppTypeMapping) {
  EXPECT_EQ(dtype_of<float>, DType::kFloat32);
  EXPECT_EQ(dtype_of<std::complex<double>>, DType::kComplex128);
  EXPECT_EQ(dtype_of<Half>, DType::kFloat16);
  for (DType d : kAllDTypes) {
    const std::size_t s = visit_dtype(d, [](auto tag) { return sizeof(tag); });
    EXPECT_EQ(s, dtype_size(d)) << dtype_name(d);
  }
}

// Every one of the 65536 float16 bit patterns survives float16 -> float32 -> float16 unchanged (NaN payloads too).
TEST(Half, EveryBitPatternRoundTripsExactly) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const Half h{static_cast<std::uint16_t>(b)};
    const float f = half_to_float(h);
    ASSERT_EQ(float_to_half(f).bits, h.bits) << "bits 0x" << std::hex << b;
  }
}

TEST(BFloat16, EveryBitPatternRoundTripsExactly) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const BFloat16 h{static_cast<std::uint16_t>(b)};
    ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(h)).bits, h.bits) << "bits 0x" << std::hex << b;
  }
}

TEST(Half, KnownValuesAndRounding) {
  EXPECT_EQ(float_to_half(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_half(65504.0f).bits, 0x7bff);   // largest finite
  EXPECT_EQ(float_to_half(65519.0f).bits, 0x7bff);   // still rounds down
  EXPECT_EQ(float_to_half(65520.0f).bits, 0x7c00);   // ties to even: overflow to inf
  EXPECT_EQ(float_to_half(0.1f).bits, 0x2e66);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even: zero
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -26)).bits, 0x0001);  // above the tie: rounds up
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie, even stays
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(3.0f, -11)).bits, 0x3c02);      // tie, odd rounds up
  EXPECT_EQ(float_to_half(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  EXPECT_EQ(float_to_half(INFINITY).bits, 0x7c00);
  EXPECT_EQ(half_to_float(Half{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(Half{0x3555}), 0.333251953125f);
}

TEST(BFloat16, KnownValuesAndRounding) {
  EXPECT_EQ(float_to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(3.0f, -8)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bfloat16(3.0e38f).bits, 0x7f62);
  EXPECT_EQ(float_to_bfloat16(3.4e38f).bits, 0x7f80);  // rounds past the largest finite: inf
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  // A NaN whose payload lives only in the low 16 bits must stay NaN.
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::bit_cast<float>(0x7f800001u)))));
}

}  // namespace
}  // namespace shardkit
