#include "shardkit/core/shape.hpp"

#include <gtest/gtest.h>

#include <cstdint>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

TEST(Shape, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({}), Strides{});
  EXPECT_EQ(contiguous_strides({3, 0, 2}), (Strides{2, 2, 1}));
  // Empty, with strides past 64 bits: they saturate.
  EXPECT_EQ(contiguous_strides({0, std::int64_t{1} << 40, std::int64_t{1} << 40}),
            (Strides{INT64_MAX, std::int64_t{1} << 40, 1}));
}

TEST(Shape, Numel) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({2, 3}), 6);
  EXPECT_EQ(shape_numel({INT64_MAX, 0}), 0);
  EXPECT_THROW(shape_numel({2, -1}), InvalidArgument);
  EXPECT_THROW(shape_numel({INT64_MAX, 2}), InvalidArgument);
}

TEST(Shape, Text) {
  EXPECT_EQ(shape_to_string({}), "()");
  EXPECT_EQ(shape_to_string({5}), "(5,)");
  EXPECT_EQ(shape_to_string({2, 3}), "(2, 3)");
}

TEST(Shape, NormalizeDim) {
  EXPECT_EQ(normalize_dim(1, 3, "op"), 1);
  EXPECT_EQ(normalize_dim(-1, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-3, 3, "op"), 0);
  EXPECT_THROW(normalize_dim(3, 3, "op"), InvalidArgument);
  EXPECT_THROW(normalize_dim(-4, 3, "op"), InvalidArgument);
  try {
    normalize_dim(5, 2, "slice");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("slice: dimension 5 out of range for an array of rank 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardkit
