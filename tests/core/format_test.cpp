#include "shardkit/core/array.hpp"

#include <gtest/gtest.h>

namespace shardkit {
namespace {

TEST(Format, NumpyLikeText) {
  EXPECT_EQ(Array::arange(4, DType::kFloat32).to_string(), "[0. 1. 2. 3.]");
  EXPECT_EQ(Array::arange(4, DType::kInt32).reshape({2, 2}).to_string(), "[[0 1]\n [2 3]]");
  EXPECT_EQ(Array::from_values<double>({0.5, 12.25}).to_string(), "[  0.5 12.25]");
  EXPECT_EQ(Array::from_values<bool>({true, false}).to_string(), "[ True False]");
  EXPECT_EQ(Array::arange(2000, DType::kInt32).to_string(), "[   0    1    2 ... 1997 1998 1999]");
  EXPECT_EQ(Array::arange(8, DType::kInt32).reshape({2, 2, 2}).to_string(), "[[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]]");
}

}  // namespace
}  // namespace shardkit
