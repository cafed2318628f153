// CUDA paths of core. Every test skips cleanly without a GPU (no driver or no device).

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "array_compare.hpp"
#include "gpu_required.hpp"
#include "shardkit/core/array.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/dlpack.hpp"
#include "shardkit/core/gemm.hpp"
#include "shardkit/core/kernels.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) SHARDKIT_GPU_SKIP("no GPU: " << cuda::unavailable_reason())

TEST(Cuda, DeviceQueriesNeverCrash) {
  // Holds everywhere: zero GPUs comes with a reason, GPUs come with a driver.
  const int n = cuda::device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(cuda::unavailable_reason().empty());
  } else {
    EXPECT_GT(cuda::driver_version(), 0);
    EXPECT_FALSE(cuda::device_name(0).empty());
  }
  SKIP_WITHOUT_GPU();
}

TEST(Cuda, HostDeviceRoundTrip) {
  SKIP_WITHOUT_GPU();
  for (DType d : kAllDTypes) {
    Array h = Array::arange(1001, d);
    Array dev = h.to(Device::cuda(0));
    EXPECT_EQ(dev.device(), Device::cuda(0));
    EXPECT_TRUE(allclose(dev.to(Device::cpu()), h)) << dtype_name(d);
  }
}

TEST(Cuda, StridedDeviceCopies) {
  SKIP_WITHOUT_GPU();
  Array h = Array::arange(24, DType::kFloat64).reshape({2, 3, 4});
  Array dev = h.to(Device::cuda(0));
  Array t = dev.permute({2, 0, 1}).contiguous();  // device strided -> device contiguous (kernel)
  EXPECT_TRUE(allclose(t.to(Device::cpu()), h.permute({2, 0, 1}).contiguous()));
  Array host_dst = Array::zeros({4, 2, 3}, DType::kFloat64);
  Array view = host_dst.permute({1, 2, 0});  // pageable strided destination
  view.copy_from(dev);
  EXPECT_TRUE(allclose(host_dst, h.permute({2, 0, 1}).contiguous()));
  Array dev_dst = Array::zeros({4, 3}, DType::kFloat64, Device::cuda(0));
  dev_dst.permute({1, 0}).copy_from(h.select(0, 1));  // pageable contiguous -> device strided
  EXPECT_TRUE(allclose(dev_dst.to(Device::cpu()), h.select(0, 1).permute({1, 0}).contiguous()));
}

TEST(Cuda, PinnedAndManagedMemory) {
  SKIP_WITHOUT_GPU();
  Array pinned = Array::arange(64, DType::kInt32, Device::cuda_host());
  EXPECT_EQ(pinned.to_vector<std::int32_t>()[63], 63);
  EXPECT_TRUE(cuda::pointer_info(pinned.data()).is_pinned_host);
  Array managed = Array::zeros({64}, DType::kInt32, Device::cuda_managed(0));
  managed.copy_from(pinned);
  EXPECT_EQ(static_cast<std::int32_t*>(managed.data())[5], 5);  // host-accessible
  Array dev = Array::zeros({64}, DType::kInt32, Device::cuda(0));
  EXPECT_TRUE(cuda::pointer_info(dev.data()).is_device);
}

TEST(Cuda, EventsOrderStreams) {
  SKIP_WITHOUT_GPU();
  cuda::Stream a = cuda::Stream::create(0), b = cuda::Stream::create(0);
  Array x = Array::arange(1 << 20, DType::kFloat32, Device::cuda(0));
  Array y = Array::zeros({1 << 20}, DType::kFloat32, Device::cuda(0));
  cuda::memcpy_async(y.data(), x.data(), x.nbytes(), a.handle());
  auto ev = cuda::record_event(a.handle(), 0);
  ev->enqueue_wait(b.handle());
  Array z = Array::zeros({1 << 20}, DType::kFloat32, Device::cuda(0));
  cuda::memcpy_async(z.data(), y.data(), y.nbytes(), b.handle());
  b.synchronize();
  EXPECT_TRUE(ev->is_complete());
  EXPECT_TRUE(allclose(z.to(Device::cpu()), x.to(Device::cpu())));
}

TEST(Cuda, DLPackDeviceTensorsKeepTheirDevice) {
  SKIP_WITHOUT_GPU();
  Array dev = Array::arange(10, DType::kFloat32, Device::cuda(0));
  Array back = from_dlpack(to_dlpack_versioned(dev));
  EXPECT_EQ(back.device(), Device::cuda(0));
  EXPECT_EQ(back.data(), dev.data());
}

TEST(Cuda, CublasGemmMatchesHost) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    Array a = Array::arange(12, d).reshape({3, 4}), b = Array::arange(8, d).reshape({4, 2});
    Array c_host = Array::empty({3, 2}, d);
    gemm(a, b, c_host);
    Array c_dev = Array::empty({3, 2}, d, Device::cuda(0));
    gemm(a.to(Device::cuda(0)), b.to(Device::cuda(0)), c_dev);
    cuda::synchronize(cuda::library_stream(0));
    EXPECT_TRUE(allclose(c_dev.to(Device::cpu()), c_host)) << dtype_name(d);
  }
}

TEST(Cuda, ScaleKernel) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kComplex128}) {
    Array host = Array::arange(1000, d);
    Array dev = host.to(Device::cuda(0));
    scale(dev, 2.0);
    scale(host, 2.0);
    EXPECT_TRUE(allclose(dev.to(Device::cpu()), host, 0, 0)) << dtype_name(d);
  }
}

// On a caller's stream gemm returns with C still being written: C must carry a ready event that host access waits
// for (on the simulated GPU, the random delays make a missing wait read stale C).
TEST(Cuda, GemmOnACallersStreamLeavesCReady) {
  SKIP_WITHOUT_GPU();
  cuda::Stream s = cuda::Stream::create(0);
  Array a = Array::arange(64 * 32, DType::kFloat64).reshape({64, 32}), b = Array::arange(32 * 16, DType::kFloat64).reshape({32, 16});
  Array want = Array::empty({64, 16}, DType::kFloat64);
  gemm(a, b, want);
  const Array da = a.to(Device::cuda(0)), db = b.to(Device::cuda(0));
  for (int i = 0; i < 10; ++i) {
    Array c = Array::zeros({64, 16}, DType::kFloat64, Device::cuda(0));
    gemm(da, db, c, 1.0, 0.0, s.handle());
    EXPECT_NE(c.ready_event(), nullptr);
    EXPECT_TRUE(allclose(c.to(Device::cpu()), want, 0, 0)) << "try " << i;
  }
  // Managed memory is device memory to the library: C is read through the ready event, not raced.
  Array m = Array::zeros({64, 16}, DType::kFloat64, Device::cuda_managed(0));
  gemm(a.to(Device::cuda_managed(0)), b.to(Device::cuda_managed(0)), m, 1.0, 0.0, s.handle());
  EXPECT_TRUE(allclose(m.to(Device::cpu()), want, 0, 0));
}

// scale / add_into on non-contiguous device arrays with a caller's stream: pack, kernel and unpack must be ordered
// on one stream, and the result readable through the library afterwards.
TEST(Cuda, ScaleAndAddOnStridedViewsWithACallersStream) {
  SKIP_WITHOUT_GPU();
  cuda::Stream s = cuda::Stream::create(0);
  const Array h = Array::arange(48 * 40, DType::kFloat32).reshape({48, 40});
  for (int i = 0; i < 10; ++i) {
    Array dev = h.to(Device::cuda(0));
    Array view = dev.permute({1, 0});  // non-contiguous
    scale(view, 2.0, s.handle());
    Array want = h.clone();
    scale(want, 2.0);
    EXPECT_TRUE(allclose(view.to(Device::cpu()), want.permute({1, 0}).contiguous(), 0, 0)) << "scale, try " << i;

    Array y = h.to(Device::cuda(0));
    Array yv = y.permute({1, 0});
    add_into(yv, h.to(Device::cuda(0)).permute({1, 0}), s.handle());
    EXPECT_TRUE(allclose(yv.to(Device::cpu()), want.permute({1, 0}).contiguous(), 0, 0)) << "add_into, try " << i;
  }
}

// Order keys on the device: the same keys as on the host, enqueued on the caller's stream (in place too), and back.
TEST(Cuda, OrderKeysOnAStreamMatchTheHost) {
  SKIP_WITHOUT_GPU();
  cuda::Stream s = cuda::Stream::create(0);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Array h = Array::from_values<float>({1.5f, -0.0f, 0.0f, nan, -inf, inf, -2.0f, 1e-40f});
  for (bool nan_high : {true, false}) {
    Array want = Array::empty(h.shape(), DType::kInt32);
    to_order_keys(h, want, nan_high);
    Array dev = h.to(Device::cuda(0));
    Array keys = Array::empty(h.shape(), DType::kInt32, Device::cuda(0));
    to_order_keys(dev, keys, nan_high, s.handle());
    Array in_place = Array::borrow(dev.data(), dev.shape(), DType::kInt32, dev.device(), nullptr);
    to_order_keys(dev, in_place, nan_high, s.handle());
    s.synchronize();
    EXPECT_EQ(keys.to_vector<std::int32_t>(), want.to_vector<std::int32_t>());
    EXPECT_EQ(in_place.to_vector<std::int32_t>(), want.to_vector<std::int32_t>());
    Array back = Array::empty(h.shape(), DType::kFloat32, Device::cuda(0));
    from_order_keys(keys, back, s.handle());
    s.synchronize();
    const std::vector<float> got = back.to_vector<float>(), orig = h.to_vector<float>();
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(orig[i])) {
        EXPECT_TRUE(std::isnan(got[i]));
      } else {
        EXPECT_EQ(std::memcmp(&got[i], &orig[i], sizeof(float)), 0) << orig[i] << " came back as " << got[i];
      }
    }
  }
  Array dev = h.to(Device::cuda(0)), keys = Array::empty(h.shape(), DType::kInt32, Device::cuda(0));
  EXPECT_THROW(to_order_keys(dev, keys, true), InvalidArgument);  // a CUDA array needs the stream to enqueue on
}

// DLPack export for a consumer reading on its own stream: that stream waits on the device; the host does not block.
TEST(Cuda, DLPackExportWithAConsumerStreamDoesNotBlockTheHost) {
  SKIP_WITHOUT_GPU();
  cuda::Stream producer = cuda::Stream::create(0), consumer = cuda::Stream::create(0);
  Array big = Array::zeros({std::int64_t{16} << 20}, DType::kFloat32, Device::cuda(0));
  Array scratch = Array::zeros({std::int64_t{16} << 20}, DType::kFloat32, Device::cuda(0));
  Array x = Array::arange(10, DType::kFloat32, Device::cuda(0));
  for (int i = 0; i < 20; ++i) cuda::memcpy_async(scratch.data(), big.data(), big.nbytes(), producer.handle());
  auto pending = cuda::record_event(producer.handle(), 0);
  x.set_ready(pending);
  DLManagedTensorVersioned* t = to_dlpack_versioned(x, false, consumer.handle());
  EXPECT_FALSE(pending->is_complete()) << "the export waited on the host";
  consumer.synchronize();
  EXPECT_TRUE(pending->is_complete()) << "the consumer's stream did not wait for the producer";
  t->deleter(t);
}

// cuBLAS handles are per device, not per thread: GEMMs from several threads on their own streams must not let one
// thread's cublasSetStream redirect another's GEMM (the simulated cuBLAS aborts when that happens).
TEST(Cuda, GemmsFromSeveralThreads) {
  SKIP_WITHOUT_GPU();
  const Array a = Array::arange(16 * 8, DType::kFloat32).reshape({16, 8}), b = Array::arange(8 * 4, DType::kFloat32).reshape({8, 4});
  Array want = Array::empty({16, 4}, DType::kFloat32);
  gemm(a, b, want);
  const Array da = a.to(Device::cuda(0)), db = b.to(Device::cuda(0));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      cuda::DeviceGuard guard(0);
      cuda::Stream s = cuda::Stream::create(0);
      for (int i = 0; i < 25; ++i) {
        Array c = Array::zeros({16, 4}, DType::kFloat32, Device::cuda(0));
        gemm(da, db, c, 1.0, 0.0, s.handle());
        if (!allclose(c.to(Device::cpu()), want, 0, 0)) ++bad[t];
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

// A thread other than the one that bound the device starts on device 0 (CUDA's rule): kernels and copies the library
// launches for an array of another device must set that device themselves.
TEST(Cuda, KernelsFromAFreshThreadUseTheArraysDevice) {
  SKIP_WITHOUT_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";  // a limit of this machine, not a missing GPU
  const Array h = Array::arange(12, DType::kFloat32).reshape({3, 4});
  std::string error;
  Array out;
  std::thread worker([&] {
    try {
      Array x = h.to(Device::cuda(1));
      scale(x, 2.0);
      out = x.permute({1, 0}).to(Device::cpu());  // strided: a kernel on device 1
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  worker.join();
  ASSERT_EQ(error, "");
  Array want = h.clone();
  scale(want, 2.0);
  EXPECT_TRUE(allclose(out, want.permute({1, 0}).contiguous(), 0, 0));
}

}  // namespace
}  // namespace shardkit
