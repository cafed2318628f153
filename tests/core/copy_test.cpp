#include "shardkit/core/array.hpp"

#include <gtest/gtest.h>

namespace shardkit {
namespace {

TEST(Copy, BetweenLayouts) {
  Array a = Array::arange(24, DType::kFloat32).reshape({2, 3, 4});
  Array dst = Array::zeros({4, 3, 2}, DType::kFloat32);
  Array view = dst.permute({2, 1, 0});  // shape (2, 3, 4), strides (1, 2, 6)
  view.copy_from(a);
  const std::vector<float> got = dst.to_vector<float>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(got[k * 6 + j * 2 + i], static_cast<float>(i * 12 + j * 4 + k));

  Array c = a.clone();
  EXPECT_NE(c.data(), a.data());
  c.fill_zero();
  EXPECT_EQ(a.to_vector<float>()[5], 5.0f);
  EXPECT_THROW(c.copy_from(Array::zeros({2, 3}, DType::kFloat32)), InvalidArgument);
  EXPECT_THROW(c.copy_from(Array::zeros({2, 3, 4}, DType::kFloat64)), InvalidArgument);

  // Strided destination and strided source at once, 16-byte elements.
  Array z = Array::arange(6, DType::kComplex128).reshape({2, 3});
  Array zt = Array::zeros({3, 2}, DType::kComplex128);
  Array zt_view = zt.permute({1, 0});
  zt_view.copy_from(z.permute({0, 1}));
  EXPECT_EQ(zt.to_vector<std::complex<double>>()[1], std::complex<double>(3.0, 0.0));
}

}  // namespace
}  // namespace shardkit
