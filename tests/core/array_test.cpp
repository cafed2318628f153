#include "shardkit/core/array.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "shardkit/core/waitable.hpp"

namespace shardkit {
namespace {

TEST(Array, EmptyZerosAndLayout) {
  Array a = Array::zeros({2, 3}, DType::kFloat64);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.strides(), (Strides{3, 1}));
  EXPECT_EQ(a.numel(), 6);
  EXPECT_EQ(a.nbytes(), 48u);
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.device(), Device::cpu());
  EXPECT_EQ(a.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 64, 0u);

  Array scalar = Array::empty({}, DType::kInt32);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.ndim(), 0);

  Array none = Array::empty({4, 0, 2}, DType::kInt8);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_NE(none.data(), nullptr);
  EXPECT_TRUE(none.is_contiguous());

  EXPECT_THROW(Array::empty({2, -1}, DType::kFloat32), InvalidArgument);
  EXPECT_THROW(Array::empty({INT64_MAX, 4}, DType::kFloat32), InvalidArgument);
}

TEST(Array, FromValuesArangeAndVectors) {
  Array a = Array::from_values<std::int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(a.to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_THROW(a.to_vector<float>(), InvalidArgument);
  EXPECT_THROW(Array::from_values<float>({1.f, 2.f}, {3}), InvalidArgument);
  Array r = Array::arange(5, DType::kFloat16);
  std::vector<Half> h = r.to_vector<Half>();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(half_to_float(h[i]), static_cast<float>(i));
}

TEST(Array, SliceSelectReshapePermute) {
  Array a = Array::arange(12, DType::kInt64).reshape({3, 4});
  Array rows = a.slice(0, 1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.to_vector<std::int64_t>(), (std::vector<std::int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));

  Array cols = a.slice(1, 1, 3);
  EXPECT_EQ(cols.shape(), (Shape{3, 2}));
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(cols.storage(), a.storage());  // a view, not a copy

  Array empty_slice = a.slice(1, 2, 2);
  EXPECT_EQ(empty_slice.numel(), 0);
  EXPECT_THROW(a.slice(1, 3, 5), InvalidArgument);
  EXPECT_THROW(a.slice(2, 0, 1), InvalidArgument);
  EXPECT_THROW(a.slice(0, 2, 1), InvalidArgument);

  Array col2 = a.select(1, 2);
  EXPECT_EQ(col2.shape(), (Shape{3}));
  EXPECT_EQ(col2.to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 6, 10}));

  Array t = a.permute({1, 0});
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.contiguous().to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_THROW(t.reshape({12}), InvalidArgument);
  EXPECT_THROW(a.reshape({5}), InvalidArgument);
  EXPECT_THROW(a.permute({0, 0}), InvalidArgument);
  EXPECT_EQ(a.dim(-1), 4);
  EXPECT_THROW(a.dim(2), InvalidArgument);
}

TEST(Array, ReadOnlyArraysRefuseWrites) {
  std::vector<float> buf(4, 1.0f);
  Array ro = Array::borrow(buf.data(), {4}, DType::kFloat32, Device::cpu(), nullptr, {}, /*read_only=*/true);
  EXPECT_TRUE(ro.read_only());
  EXPECT_THROW(ro.copy_from(Array::zeros({4}, DType::kFloat32)), InvalidArgument);
  EXPECT_THROW(ro.fill_zero(), InvalidArgument);
  EXPECT_EQ(buf[0], 1.0f);
  EXPECT_EQ(ro.to_vector<float>(), buf);  // reads are fine
  EXPECT_THROW(Array::borrow(nullptr, {4}, DType::kFloat32, Device::cpu(), nullptr), InvalidArgument);
  EXPECT_THROW(Array::borrow(buf.data(), {2}, DType::kFloat32, Device::cpu(), nullptr, {-1}), InvalidArgument);
}

TEST(Array, BorrowKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<int>>(std::vector<int>{7, 8, 9});
  std::weak_ptr<std::vector<int>> watch = owner;
  {
    Array a = Array::borrow(owner->data(), {3}, DType::kInt32, Device::cpu(), owner);
    owner.reset();
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(a.to_vector<std::int32_t>()[2], 9);
  }
  EXPECT_TRUE(watch.expired());
}

// A Waitable that completes when waited on and counts the waits.
class CountingEvent : public Waitable {
 public:
  void wait() override {
    ++waits;
    done = true;
  }
  bool is_complete() override { return done; }
  int waits = 0;
  bool done = false;
};

TEST(Array, RetargetKeepsTheLayoutAndDropsOwnerAndReadyEvent) {
  auto owner = std::make_shared<std::vector<int>>(std::vector<int>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<int>> watch = owner;
  Array a = Array::borrow(owner->data(), {2, 3}, DType::kInt32, Device::cpu(), owner, {1, 2}, /*read_only=*/true);
  a.set_ready(std::make_shared<CountingEvent>());
  owner.reset();
  std::vector<int> other = {10, 20, 30, 40, 50, 60};
  a.retarget(other.data());
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(a.ready_event(), nullptr);
  EXPECT_EQ(a.data(), other.data());
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.strides(), (Strides{1, 2}));
  EXPECT_TRUE(a.read_only());
  EXPECT_EQ(a.to_vector<std::int32_t>(), (std::vector<int>{10, 30, 50, 20, 40, 60}));
}

TEST(Array, HostAccessWaitsForTheReadyEvent) {
  Array a = Array::arange(3, DType::kInt32);
  auto ev = std::make_shared<CountingEvent>();
  a.set_ready(ev);
  EXPECT_EQ(a.ready_event(), ev);
  EXPECT_EQ(a.to_vector<std::int32_t>().size(), 3u);
  EXPECT_EQ(ev->waits, 1);
  EXPECT_EQ(a.ready_event(), nullptr);  // cleared once complete
  (void)a.to_string();
  EXPECT_EQ(ev->waits, 1);

  auto ev2 = std::make_shared<CountingEvent>();
  a.set_ready(ev2);
  (void)a.to_string();
  EXPECT_EQ(ev2->waits, 1);
}

TEST(Array, CudaArraysNeedAGpu) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; core_gpu_tests covers this path";
  EXPECT_THROW(Array::empty({4}, DType::kFloat32, Device::cuda(0)), BackendError);
  EXPECT_FALSE(cuda::unavailable_reason().empty());
}

}  // namespace
}  // namespace shardkit
