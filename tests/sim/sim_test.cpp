// The simulated GPU (sim/) through the CUDA runtime API it implements.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "shardkit/sim/sim.hpp"

namespace {

TEST(SimGpu, DevicesComeFromTheEnvironment) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 2);  // SHARDKIT_SIM_GPUS=2 (tests/sim/CMakeLists.txt)
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
}

TEST(SimGpuDeathTest, HostAccessToDeviceMemoryIsCaught) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_DEATH({ std::printf("%d\n", static_cast<volatile int*>(p)[3]); }, "host access to simulated device memory");
  // Through a copy it is fine.
  int v[16] = {};
  ASSERT_EQ(cudaMemset(p, 0, 64), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v, p, sizeof v, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(v[3], 0);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// One stream fills a device buffer, another copies it to pinned memory. With the event wait the copy sees the fill;
// without it, the random delays (up to 2 ms each here) let the copy run first at least once in a few tries.
int stale_copies(bool wait, int tries) {
  cudaStream_t a, b;
  cudaEvent_t filled;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&filled, cudaEventDisableTiming);
  void* dev = nullptr;
  unsigned char* host = nullptr;
  cudaMalloc(&dev, 4096);
  cudaMallocHost(reinterpret_cast<void**>(&host), 4096);
  int stale = 0;
  for (int i = 0; i < tries; ++i) {
    cudaMemsetAsync(dev, 0, 4096, a);
    cudaStreamSynchronize(a);
    cudaMemsetAsync(dev, 7, 4096, a);
    cudaEventRecord(filled, a);
    if (wait) cudaStreamWaitEvent(b, filled, 0);
    cudaMemcpyAsync(host, dev, 4096, cudaMemcpyDefault, b);
    cudaStreamSynchronize(b);
    if (host[4095] != 7) ++stale;
    cudaStreamSynchronize(a);
  }
  cudaFree(dev);
  cudaFreeHost(host);
  cudaEventDestroy(filled);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  return stale;
}

TEST(SimGpu, CrossStreamWaitOrdersAndItsAbsenceShows) {
  EXPECT_EQ(stale_copies(true, 20), 0);
  EXPECT_GT(stale_copies(false, 20), 0);
}

TEST(SimGpu, EventQueryIsNotReadyUntilTheStreamGetsThere) {
  cudaStream_t s;
  cudaEvent_t e;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreate(&e);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);  // never recorded: complete
  for (int i = 0; i < 20; ++i) ASSERT_EQ(shardkit::sim::launch(s, [] {}), cudaSuccess);
  cudaEventRecord(e, s);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);  // 20 operations of up to 2 ms each are still queued
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

// cudaStreamDestroy returns at once and the stream finishes its queue; device-wide synchronisation (here cudaFree's)
// still waits for that work, so a kernel of a destroyed stream never runs on freed memory.
TEST(SimGpu, FreeWaitsForTheWorkOfDestroyedStreams) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(shardkit::sim::launch(s, [dev, &ran] {
                std::memset(shardkit::sim::worker_view(dev), 1, 4096);
                ++ran;
              }),
              cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_LT(ran.load(), 20);  // 20 operations of up to 2 ms each are still queued
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
  EXPECT_EQ(ran.load(), 20);
}

TEST(SimGpu, KernelsOnAnotherDevicesStreamAreRefused) {
  cudaStream_t s1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(shardkit::sim::launch(s1, [] {}), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaSetDevice(1);
  EXPECT_EQ(shardkit::sim::launch(s1, [] {}), cudaSuccess);
  cudaStreamSynchronize(s1);
  cudaStreamDestroy(s1);
  cudaSetDevice(0);
}

TEST(SimGpu, PointerAttributesNameTheMemory) {
  void *d = nullptr, *m = nullptr, *h = nullptr;
  cudaMalloc(&d, 10);
  cudaMallocManaged(&m, 10, cudaMemAttachGlobal);
  cudaMallocHost(&h, 10);
  int plain = 0;
  cudaPointerAttributes a{};
  cudaPointerGetAttributes(&a, static_cast<char*>(d) + 5);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  cudaPointerGetAttributes(&a, m);
  EXPECT_EQ(a.type, cudaMemoryTypeManaged);
  cudaPointerGetAttributes(&a, h);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  cudaPointerGetAttributes(&a, &plain);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  cudaFree(d);
  cudaFree(m);
  cudaFreeHost(h);
}

}  // namespace
