#pragma once

// The CUDA runtime as shardkit uses it, without including cuda_runtime.h: handles are the runtime's own opaque
// pointer types, forward-declared. Every function works in a build without CUDA (SHARDKIT_HAVE_CUDA == 0) or on a
// machine without a driver or GPU: queries report zero devices and operations that need a GPU throw BackendError.

#include <cstddef>
#include <memory>
#include <string>

struct CUstream_st;
struct CUevent_st;

namespace shardkit {

/// A CUDA stream (cudaStream_t). nullptr is never used by shardkit for its own work (no legacy default stream).
using StreamHandle = CUstream_st*;
/// A CUDA event (cudaEvent_t).
using EventHandle = CUevent_st*;

class Waitable;

namespace cuda {

/// True when this build contains the CUDA paths.
bool compiled() noexcept;
/// Number of usable GPUs: 0 when CUDA was not built, no driver is installed (cudaErrorInsufficientDriver) or no
/// device is present (cudaErrorNoDevice). Never throws.
int device_count() noexcept;
/// Why device_count() is zero ("" when it is not): "not built with CUDA", "no CUDA driver", "no CUDA device", ...
std::string unavailable_reason();
/// Driver API version (e.g. 13000), 0 when there is no driver.
int driver_version() noexcept;
/// Runtime version this build links (e.g. 13000), 0 without CUDA.
int runtime_version() noexcept;
/// Marketing name of a device ("NVIDIA H100 80GB HBM3"). @throws BackendError without a device.
std::string device_name(int index);
/// The calling thread's current device. @throws BackendError without a device.
int current_device();
/// Makes `index` the calling thread's current device. @throws InvalidArgument for a bad index.
void set_device(int index);

/// Sets a device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// An owned non-blocking CUDA stream. Move-only.
class Stream {
 public:
  Stream() = default;
  /// Creates a non-blocking stream on `device`.
  static Stream create(int device);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  StreamHandle handle() const noexcept { return handle_; }
  int device() const noexcept { return device_; }
  /// Blocks until all work on the stream is done.
  void synchronize() const;

 private:
  StreamHandle handle_ = nullptr;
  int device_ = -1;
};

/// The stream shardkit uses on `device` when the caller gives none (one per device and process, created on first use).
StreamHandle library_stream(int device);
/// Blocks until all work on `stream` is done.
void synchronize(StreamHandle stream);
/// Asynchronous copy of `bytes` between any two CUDA-known or host addresses, ordered on `stream`.
void memcpy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream);

/// Records an event on `stream` and returns it as a Waitable whose enqueue_wait is a device-side wait.
std::shared_ptr<Waitable> record_event(StreamHandle stream, int device);

/// Device, pinned and managed allocations (used by Array). Sizes of 0 are allowed.
void* malloc_device(std::size_t bytes, int device);
void free_device(void* ptr) noexcept;
void* malloc_host_pinned(std::size_t bytes);
void free_host_pinned(void* ptr) noexcept;
void* malloc_managed(std::size_t bytes, int device);

/// Which CUDA memory a pointer belongs to: the device kind and index, from cudaPointerGetAttributes. Returns false
/// for ordinary host memory or when CUDA is unavailable.
struct PointerInfo {
  bool is_device = false;
  bool is_managed = false;
  bool is_pinned_host = false;
  int device = -1;
};
PointerInfo pointer_info(const void* ptr) noexcept;

}  // namespace cuda
}  // namespace shardkit
