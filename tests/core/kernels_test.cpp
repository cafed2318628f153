#include "shardkit/core/kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

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

// Floats that order keys must keep apart: signed zeros, denormals, the extremes, infinities and NaNs (quiet, signalling,
// negative, with payloads), then random bit patterns of every exponent.
template <typename F>
std::vector<F> order_key_samples() {
  using L = std::numeric_limits<F>;
  std::vector<F> v = {F(0),           -F(0),        L::denorm_min(), -L::denorm_min(), L::min(),      -L::min(),
                      L::max(),       -L::max(),    L::infinity(),   -L::infinity(),   L::epsilon(),  F(1),
                      F(-1),          F(0.1),       F(-2.5),         L::quiet_NaN(),   -L::quiet_NaN(), L::signaling_NaN()};
  using U = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const U bits = static_cast<U>(rng());
    F f;
    std::memcpy(&f, &bits, sizeof f);
    v.push_back(f);
  }
  return v;
}

template <typename F, typename K>
void check_order_keys(DType dt) {
  const std::vector<F> xs = order_key_samples<F>();
  const auto n = static_cast<std::int64_t>(xs.size());
  const Array x = Array::from_values<F>(xs);
  for (bool nan_high : {true, false}) {
    SCOPED_TRACE(::testing::Message() << dt << (nan_high ? " NaN high" : " NaN low"));
    Array keys = Array::empty({n}, order_key_dtype(dt));
    to_order_keys(x, keys, nan_high);
    const K* k = keys.data_as<K>();
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < n; j += 37) {  // a sample of the pairs: the order of the keys is the float order
        const F a = xs[i], b = xs[j];
        if (std::isnan(a) || std::isnan(b)) {
          if (std::isnan(a) && !std::isnan(b)) {
            EXPECT_TRUE(nan_high ? k[i] > k[j] : k[i] < k[j]) << a << " vs " << b;
          }
          if (std::isnan(a) && std::isnan(b)) {
            EXPECT_EQ(k[i], k[j]);  // every NaN alike
          }
        } else if (a < b || (a == b && std::signbit(a) && !std::signbit(b))) {
          EXPECT_LT(k[i], k[j]) << a << " vs " << b;
        } else if (a == b && std::signbit(a) == std::signbit(b)) {
          EXPECT_EQ(k[i], k[j]) << a << " vs " << b;
        }
      }
    }
    // Back: every non-NaN bit for bit, every NaN a NaN; in place too.
    Array back = Array::empty({n}, dt);
    from_order_keys(keys, back, nullptr);
    Array same = x.clone();
    Array same_keys = Array::borrow(same.data(), same.shape(), order_key_dtype(dt), same.device(), nullptr);
    to_order_keys(same, same_keys, nan_high);
    from_order_keys(same_keys, same);
    for (const Array& got : {back, same}) {
      for (std::int64_t i = 0; i < n; ++i) {
        const F g = got.data_as<F>()[i];
        if (std::isnan(xs[i])) {
          EXPECT_TRUE(std::isnan(g));
        } else {
          EXPECT_EQ(std::memcmp(&g, &xs[i], sizeof g), 0) << xs[i] << " came back as " << g;
        }
      }
    }
  }
}

TEST(OrderKeys, KeepTheFloatOrderAndPutNaNAtTheEndAsked) {
  check_order_keys<float, std::int32_t>(DType::kFloat32);
  check_order_keys<double, std::int64_t>(DType::kFloat64);
}

TEST(OrderKeys, MaxOfKeysPropagatesNaNWhereFmaxDropsIt) {
  // The reduction the NCCL backend runs: an integer max (min) over the keys of every rank's value.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (bool max : {true, false}) {
    const std::vector<float> ranks = {1.0f, nan, -3.0f};
    Array keys = Array::empty({3}, DType::kInt32);
    to_order_keys(Array::from_values<float>(ranks), keys, max);
    const std::int32_t* k = keys.data_as<std::int32_t>();
    const std::int32_t best = max ? std::max({k[0], k[1], k[2]}) : std::min({k[0], k[1], k[2]});
    Array out = Array::empty({1}, DType::kFloat32);
    from_order_keys(Array::from_values<std::int32_t>({best}), out);
    EXPECT_TRUE(std::isnan(out.data_as<float>()[0])) << (max ? "max" : "min");
    EXPECT_FALSE(std::isnan(max ? std::fmax(std::fmax(1.0f, nan), -3.0f) : std::fmin(std::fmin(1.0f, nan), -3.0f)));
  }
}

TEST(OrderKeys, RefusesOtherDtypesShapesAndMissingStreams) {
  Array h = Array::zeros({4}, DType::kFloat16), k32 = Array::zeros({4}, DType::kInt32);
  EXPECT_THROW(to_order_keys(h, k32, true), InvalidArgument);
  Array f = Array::zeros({4}, DType::kFloat32), k64 = Array::zeros({4}, DType::kInt64);
  Array k3 = Array::zeros({3}, DType::kInt32);
  EXPECT_THROW(to_order_keys(f, k64, true), InvalidArgument);
  EXPECT_THROW(to_order_keys(f, k3, true), InvalidArgument);
  EXPECT_THROW(order_key_dtype(DType::kInt32), InvalidArgument);
  Array e = Array::empty({0}, DType::kFloat64), ek = Array::empty({0}, DType::kInt64);
  EXPECT_NO_THROW(to_order_keys(e, ek, false));
}

}  // namespace
}  // namespace shardkit
