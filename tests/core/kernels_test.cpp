#include "shardkit/core/kernels.hpp"

#include <gtest/gtest.h>

#include "array_compare.hpp"

namespace shardkit {
namespace {

TEST(Scale, EveryFloatingDtypeInPlace) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kComplex64,
                  DType::kComplex128}) {
    Array x = Array::arange(7, d);
    scale(x, 2.0);
    Array want = Array::arange(14, d).reshape({7, 2}).select(1, 0).contiguous();  // 0, 2, 4, ...
    EXPECT_TRUE(allclose(x, want, 0, 0)) << dtype_name(d) << ": " << x.to_string();
  }
}

TEST(Scale, StridedAndEmptyAndErrors) {
  Array m = Array::arange(6, DType::kFloat64).reshape({2, 3});
  Array col = m.select(1, 1);
  scale(col, -1.0);
  EXPECT_EQ(m.to_vector<double>(), (std::vector<double>{0, -1, 2, 3, -4, 5}));
  Array e = Array::empty({0}, DType::kFloat32);
  EXPECT_NO_THROW(scale(e, 3.0));
  Array i = Array::arange(3, DType::kInt32);
  EXPECT_THROW(scale(i, 2.0), InvalidArgument);
}

}  // namespace
}  // namespace shardkit
