// The subset of the CUDA runtime API shardkit calls, on the simulated GPU. Copies follow the runtime's documented
// synchronisation rules for cudaMemcpyAsync: between device, pinned and managed memory they are queued on the
// stream; from pageable host memory the source is captured before returning; to pageable host memory the call
// returns once the copy is done.

#include <cstring>
#include <vector>

#include "sim_internal.hpp"

using namespace shardkit::sim;

namespace {

bool valid_device(int d) { return d >= 0 && d < settings().devices; }

cudaError_t fail(cudaError_t e) {
  set_last_error(e);
  return e;
}

// Pageable host memory: anything the simulation did not allocate.
bool pageable(const void* p) {
  Region r;
  return !find_region(p, &r);
}

struct ErrorName {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorName kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
};
const ErrorName* error_entry(cudaError_t e) {
  for (const auto& x : kErrors)
    if (x.code == e) return &x;
  return nullptr;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = settings().devices;
  return settings().devices > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  set_current_device(device);
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "shardkit simulated GPU %d", device);
  prop->totalGlobalMem = std::size_t{16} << 30;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->managedMemory = 1;
  prop->concurrentManagedAccess = 1;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t e) {
  const ErrorName* x = error_entry(e);
  return x ? x->name : "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  const ErrorName* x = error_entry(e);
  return x ? x->text : "unknown error";
}
cudaError_t cudaGetLastError(void) { return take_last_error(); }
cudaError_t cudaPeekAtLastError(void) { return peek_last_error(); }

// ---- memory -----------------------------------------------------------------------------------------------------
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = allocate(bytes, MemKind::kDevice, current_device());
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned int /*flags*/) {
  *p = allocate(bytes, MemKind::kManaged, current_device());
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = allocate(bytes, MemKind::kPinned, current_device());
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
// cudaFree and cudaFreeHost synchronise the device implicitly, as the runtime does.
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  synchronize_device(-1);
  return release(p, MemKind::kDevice) ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  synchronize_device(-1);
  return release(p, MemKind::kPinned) ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  std::memset(attr, 0, sizeof *attr);
  Region r;
  if (!find_region(p, &r)) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(p);
    return cudaSuccess;
  }
  attr->device = r.device;
  switch (r.kind) {
    case MemKind::kDevice:
      attr->type = cudaMemoryTypeDevice;
      attr->devicePointer = const_cast<void*>(p);
      break;
    case MemKind::kManaged:
      attr->type = cudaMemoryTypeManaged;
      attr->devicePointer = attr->hostPointer = const_cast<void*>(p);
      break;
    case MemKind::kPinned:
      attr->type = cudaMemoryTypeHost;
      attr->devicePointer = attr->hostPointer = const_cast<void*>(p);
      break;
  }
  return cudaSuccess;
}

// ---- streams ----------------------------------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  *s = create_stream(flags);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  return destroy_stream(s) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  stream_of(s)->synchronize();
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return stream_of(s)->idle() ? cudaSuccess : cudaErrorNotReady; }
cudaError_t cudaDeviceSynchronize(void) {
  synchronize_device(current_device());
  return cudaSuccess;
}

// ---- events -----------------------------------------------------------------------------------------------------
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = create_event();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int /*flags*/) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  return destroy_event(e) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  auto ev = event_of(e);
  auto st = stream_of(s);
  // The runtime refuses to record an event on a stream of another device.
  if (ev->device != st->device()) return fail(cudaErrorInvalidResourceHandle);
  std::uint64_t seq;
  {
    std::lock_guard lock(ev->mu);
    seq = ++ev->recorded;
  }
  st->enqueue([ev, seq] {
    std::lock_guard lock(ev->mu);
    if (ev->completed < seq) ev->completed = seq;
    ev->cv.notify_all();
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  auto ev = event_of(e);
  std::lock_guard lock(ev->mu);
  return ev->completed >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  auto ev = event_of(e);
  std::unique_lock lock(ev->mu);
  const std::uint64_t target = ev->recorded;
  ev->cv.wait(lock, [&] { return ev->completed >= target; });
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.f;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int /*flags*/) {
  auto ev = event_of(e);
  std::uint64_t target;
  {
    std::lock_guard lock(ev->mu);
    target = ev->recorded;  // the latest record at the time of the call, as CUDA does
  }
  if (target == 0) return cudaSuccess;
  stream_of(s)->enqueue([ev, target] {
    std::unique_lock lock(ev->mu);
    ev->cv.wait(lock, [&] { return ev->completed >= target; });
  });
  return cudaSuccess;
}

// ---- copies -----------------------------------------------------------------------------------------------------
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind /*kind*/, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  auto st = stream_of(s);
  const bool src_pageable = pageable(src), dst_pageable = pageable(dst);
  if (src_pageable && !dst_pageable) {
    // The runtime stages a pageable source before returning: the caller may reuse it at once.
    st->synchronize();
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    st->enqueue([dst, staged] { std::memcpy(rw(dst), staged->data(), staged->size()); });
    return cudaSuccess;
  }
  st->enqueue([dst, src, bytes] { std::memcpy(rw(dst), rw(src), bytes); });
  if (dst_pageable) st->synchronize();  // to pageable memory the call returns when the copy is done
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e == cudaSuccess) synchronize_device(current_device());
  return e;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  stream_of(s)->enqueue([dst, value, bytes] { std::memset(rw(dst), value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(dst, value, bytes, nullptr);
  if (e == cudaSuccess) synchronize_device(current_device());
  return e;
}

}  // extern "C"
