// The CUDA runtime calls of core: device queries, allocations, streams, events. Compiled only when CUDA is built;
// cuda_stub.cpp stands in otherwise. libcuda is never linked directly: the runtime loads the driver itself and
// reports a missing one as cudaErrorInsufficientDriver, which we treat as zero GPUs.

#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <mutex>
#include <vector>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit {
namespace detail {

void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  throw BackendError("CUDA", code,
                     concat("CUDA error ", code, " (", cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")", called_function(expr)),
                     source_location(expr, file, line));
}

}  // namespace detail

namespace cuda {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
      r.count = n;
      if (n == 0) r.reason = "no CUDA device";
    } else {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls are not confused by it
      if (e == cudaErrorInsufficientDriver)
        r.reason = "no CUDA driver";
      else if (e == cudaErrorNoDevice)
        r.reason = "no CUDA device";
      else
        r.reason = std::string("CUDA unavailable: ") + cudaGetErrorName(e);
    }
    return r;
  }();
  return p;
}

constexpr int kMaxDevices = 64;

}  // namespace

bool compiled() noexcept { return true; }
int device_count() noexcept { return probe().count; }
std::string unavailable_reason() { return probe().reason; }

int driver_version() noexcept {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

int runtime_version() noexcept {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

namespace {
void require_device(int index) {
  const int n = device_count();
  if (n == 0) throw BackendError("CUDA", 100, "no GPU available (" + unavailable_reason() + ")");
  SHARDKIT_CHECK(index >= 0 && index < n, "CUDA device index ", index, " out of range (", n, " devices)");
}
}  // namespace

std::string device_name(int index) {
  require_device(index);
  cudaDeviceProp prop{};
  SHARDKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

int current_device() {
  require_device(0);
  int d = 0;
  SHARDKIT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  require_device(index);
  SHARDKIT_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::DeviceGuard(int index) {
  previous_ = current_device();
  if (previous_ != index) set_device(index);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess)
    std::fprintf(stderr, "shardkit: warning: could not restore CUDA device %d\n", previous_);
}

Stream Stream::create(int device) {
  DeviceGuard guard(device);
  Stream s;
  cudaStream_t h = nullptr;
  SHARDKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking));
  s.handle_ = h;
  s.device_ = device;
  return s;
}

Stream::~Stream() {
  if (handle_ && cudaStreamDestroy(handle_) != cudaSuccess)
    std::fprintf(stderr, "shardkit: warning: cudaStreamDestroy failed\n");
}

Stream::Stream(Stream&& o) noexcept : handle_(o.handle_), device_(o.device_) {
  o.handle_ = nullptr;
  o.device_ = -1;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream tmp(std::move(*this));
    handle_ = o.handle_;
    device_ = o.device_;
    o.handle_ = nullptr;
    o.device_ = -1;
  }
  return *this;
}

void Stream::synchronize() const { cuda::synchronize(handle_); }

StreamHandle library_stream(int device) {
  require_device(device);
  SHARDKIT_CHECK(device < kMaxDevices, "device index ", device, " above ", kMaxDevices);
  // One stream per device for the life of the process. They are deliberately never destroyed: at static
  // destruction the CUDA runtime may already be torn down.
  static std::array<Stream*, kMaxDevices> streams{};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!streams[device]) streams[device] = new Stream(Stream::create(device));
  return streams[device]->handle();
}

void synchronize(StreamHandle stream) { SHARDKIT_CUDA_CHECK(cudaStreamSynchronize(stream)); }

void memcpy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  SHARDKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

namespace {

// Events are kept for reuse, per device: creating and destroying one around every operation costs microseconds (a
// small GEMM paid ~3 us of its 10 on an H200). Never destroyed at exit, like the streams. Reusing an event is safe:
// a wait already enqueued on it waits for the record it saw.
class EventPool {
 public:
  cudaEvent_t take(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& free = free_[static_cast<std::size_t>(device)];
      if (!free.empty()) {
        cudaEvent_t e = free.back();
        free.pop_back();
        return e;
      }
    }
    DeviceGuard guard(device);
    cudaEvent_t e = nullptr;
    SHARDKIT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void give(int device, cudaEvent_t e) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& free = free_[static_cast<std::size_t>(device)];
      if (free.size() < kKeep) {
        free.push_back(e);
        return;
      }
    }
    if (cudaEventDestroy(e) != cudaSuccess) std::fprintf(stderr, "shardkit: warning: cudaEventDestroy failed\n");
  }

 private:
  static constexpr std::size_t kKeep = 256;
  std::mutex mu_;
  std::array<std::vector<cudaEvent_t>, kMaxDevices> free_;
};

EventPool& event_pool() {
  static auto* pool = new EventPool();
  return *pool;
}

class CudaEvent final : public Waitable {
 public:
  CudaEvent(StreamHandle stream, int device) : device_(device) {
    SHARDKIT_CHECK(device >= 0 && device < kMaxDevices, "device index ", device, " out of range");
    // Only the library's own streams live as long as the process: another stream's handle may be reused by a new
    // stream after it is destroyed, which would then not be ordered after this event.
    if (stream == library_stream(device)) own_stream_ = stream;
    event_ = event_pool().take(device);
    DeviceGuard guard(device);
    if (const cudaError_t e = cudaEventRecord(event_, stream); e != cudaSuccess) {
      event_pool().give(device, event_);
      SHARDKIT_CUDA_CHECK(e);
    }
  }
  ~CudaEvent() override { event_pool().give(device_, event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void wait() override { SHARDKIT_CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool is_complete() override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    SHARDKIT_CUDA_CHECK(e);
    return true;
  }
  void enqueue_wait(StreamHandle stream) override {
    if (own_stream_ && stream == own_stream_) return;  // recorded there: what it enqueues later runs after it anyway
    SHARDKIT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
  }

 private:
  int device_;
  StreamHandle own_stream_ = nullptr;  // the library stream it was recorded on (nullptr: another stream)
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::shared_ptr<Waitable> record_event(StreamHandle stream, int device) {
  return std::make_shared<CudaEvent>(stream, device);
}

void* malloc_device(std::size_t bytes, int device) {
  DeviceGuard guard(device);
  void* p = nullptr;
  SHARDKIT_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void free_device(void* ptr) noexcept {
  if (ptr && cudaFree(ptr) != cudaSuccess) std::fprintf(stderr, "shardkit: warning: cudaFree failed\n");
}

void* malloc_host_pinned(std::size_t bytes) {
  require_device(0);
  void* p = nullptr;
  SHARDKIT_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void free_host_pinned(void* ptr) noexcept {
  if (ptr && cudaFreeHost(ptr) != cudaSuccess) std::fprintf(stderr, "shardkit: warning: cudaFreeHost failed\n");
}

void* malloc_managed(std::size_t bytes, int device) {
  DeviceGuard guard(device);
  void* p = nullptr;
  SHARDKIT_CUDA_CHECK(cudaMallocManaged(&p, bytes));
  return p;
}

PointerInfo pointer_info(const void* ptr) noexcept {
  PointerInfo info;
  if (!ptr || device_count() == 0) return info;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  info.device = attr.device;
  info.is_device = attr.type == cudaMemoryTypeDevice;
  info.is_managed = attr.type == cudaMemoryTypeManaged;
  info.is_pinned_host = attr.type == cudaMemoryTypeHost;
  return info;
}

}  // namespace cuda
}  // namespace shardkit
