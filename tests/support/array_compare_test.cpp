#include "array_compare.hpp"

#include <gtest/gtest.h>

namespace shardkit {
namespace {

TEST(ArrayCompare, AllcloseAndMaxRelativeError) {
  Array a = Array::from_values<float>({1.0f, 2.0f});
  Array b = Array::from_values<float>({1.0f, 2.00001f});
  EXPECT_TRUE(allclose(a, b));
  EXPECT_FALSE(allclose(a, Array::from_values<float>({1.0f, 2.1f})));
  EXPECT_FALSE(allclose(a, Array::from_values<double>({1.0, 2.0})));
  EXPECT_FALSE(allclose(Array::from_values<int>({1}), Array::from_values<int>({2})));
  EXPECT_NEAR(max_relative_error(a, Array::from_values<float>({1.0f, 2.2f})), 0.2f / 2.2f, 1e-6);
}

}  // namespace
}  // namespace shardkit
