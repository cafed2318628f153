#include "shardkit/core/gemm.hpp"

#include <gtest/gtest.h>

#include <random>

namespace shardkit {
namespace {

// Naive reference in double precision.
template <typename T>
std::vector<double> naive(const Array& a, const Array& b) {
  const auto va = a.contiguous().to_vector<T>(), vb = b.contiguous().to_vector<T>();
  const std::int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) c[i * n + j] += static_cast<double>(va[i * k + p]) * vb[p * n + j];
  return c;
}

template <typename T>
Array random_matrix(std::int64_t r, std::int64_t c, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-4, 4);  // small integers: every product and sum is exact
  std::vector<T> v(static_cast<std::size_t>(r * c));
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return Array::from_values<T>(std::span<const T>(v), {r, c});
}

template <typename T>
void check_gemm(std::int64_t m, std::int64_t n, std::int64_t k) {
  Array a = random_matrix<T>(m, k, 1), b = random_matrix<T>(k, n, 2);
  Array c = Array::empty({m, n}, dtype_of<T>);
  gemm(a, b, c);
  const auto got = c.to_vector<T>();
  const auto want = naive<T>(a, b);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(static_cast<double>(got[i]), want[i]) << i;
}

TEST(Gemm, HostFloat32AndFloat64OddShapes) {
  check_gemm<float>(7, 5, 3);
  check_gemm<double>(1, 9, 13);
  check_gemm<double>(33, 1, 17);
  check_gemm<float>(0, 4, 3);
}

TEST(Gemm, AccumulatesWithAlphaBeta) {
  Array a = random_matrix<double>(4, 3, 3), b = random_matrix<double>(3, 2, 4);
  Array c = Array::from_values<double>({1, 1, 1, 1, 1, 1, 1, 1}, {4, 2});
  gemm(a, b, c, 2.0, 3.0);
  const auto want = naive<double>(a, b);
  const auto got = c.to_vector<double>();
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], 2.0 * want[i] + 3.0);
}

TEST(Gemm, StridedColumnBlocks) {
  // Multiply column blocks of larger matrices in place: the layout SUMMA and collective matmul use.
  Array a = random_matrix<double>(5, 8, 5), b = random_matrix<double>(8, 6, 6);
  Array c = Array::zeros({5, 6}, DType::kFloat64);
  Array a_blk = a.slice(1, 2, 5);  // (5, 3), row stride 8
  Array b_blk = b.slice(0, 2, 5).slice(1, 1, 4);  // (3, 3), row stride 6
  Array c_blk = c.slice(1, 3, 6);  // (5, 3), row stride 6
  gemm(a_blk, b_blk, c_blk);
  const auto want = naive<double>(a_blk, b_blk);
  const auto got = c_blk.to_vector<double>();
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]);
  EXPECT_EQ(c.to_vector<double>()[0], 0.0);  // outside the block untouched
}

TEST(Gemm, ZeroInnerDimensionClears) {
  Array a = Array::empty({3, 0}, DType::kFloat32), b = Array::empty({0, 2}, DType::kFloat32);
  Array c = Array::from_values<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  gemm(a, b, c);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(6, 0.0f));
}

TEST(Gemm, HalfComplexAndErrors) {
  Array a = Array::arange(6, DType::kFloat16).reshape({2, 3});
  Array b = Array::arange(6, DType::kFloat16).reshape({3, 2});
  Array c = Array::empty({2, 2}, DType::kFloat16);
  gemm(a, b, c);
  const auto h = c.to_vector<Half>();
  EXPECT_EQ(half_to_float(h[0]), 10.0f);
  EXPECT_EQ(half_to_float(h[3]), 40.0f);

  Array za = Array::from_values<std::complex<double>>({{1, 1}, {0, 2}}, {1, 2});
  Array zb = Array::from_values<std::complex<double>>({{2, 0}, {1, -1}}, {2, 1});
  Array zc = Array::empty({1, 1}, DType::kComplex128);
  gemm(za, zb, zc);
  EXPECT_EQ(zc.to_vector<std::complex<double>>()[0], std::complex<double>(4, 4));

  Array i = Array::zeros({2, 2}, DType::kInt32);
  EXPECT_THROW(gemm(i, i, i), InvalidArgument);
  Array f = Array::zeros({2, 3}, DType::kFloat32);
  EXPECT_THROW(gemm(f, f, f), InvalidArgument);  // inner dimensions differ
  Array g = Array::zeros({3, 2}, DType::kFloat64);
  EXPECT_THROW(gemm(f, g, f), InvalidArgument);  // dtypes differ
  Array t = Array::zeros({3, 3}, DType::kFloat32).permute({1, 0}).slice(1, 0, 2);
  Array sq = Array::zeros({2, 2}, DType::kFloat32);
  EXPECT_THROW(gemm(t, sq, f), InvalidArgument);  // last dimension not unit-stride
}

}  // namespace
}  // namespace shardkit
