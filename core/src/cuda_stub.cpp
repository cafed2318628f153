// Stands in for cuda/cuda_runtime.cpp and cuda/kernels.cu in a build without CUDA: queries report no GPU and
// anything that needs one throws BackendError.

#include "kernels_internal.hpp"
#include "shardkit/core/cuda.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit {
namespace {
[[noreturn]] void not_built(const char* what) {
  throw BackendError("CUDA", 0, detail::concat(what, ": shardkit was built without CUDA (SHARDKIT_CUDA=OFF)"));
}
}  // namespace

namespace detail {
void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  throw BackendError("CUDA", code, concat("CUDA error ", code, " (built without CUDA)"), source_location(expr, file, line));
}
void cuda_strided_copy(void*, const std::int64_t*, const void*, const std::int64_t*, const std::int64_t*, int,
                       std::size_t, StreamHandle) {
  not_built("strided device copy");
}
void cuda_memset_zero(void*, std::size_t, StreamHandle) { not_built("device memset"); }
void cuda_scale(void*, DType, std::int64_t, double, StreamHandle) { not_built("device scale"); }
void cuda_add(void*, const void*, DType, std::int64_t, StreamHandle) { not_built("device add"); }
void cuda_to_order_keys(const void*, void*, bool, std::int64_t, bool, StreamHandle) { not_built("device order keys"); }
void cuda_from_order_keys(const void*, void*, bool, std::int64_t, StreamHandle) { not_built("device order keys"); }
}  // namespace detail

namespace cuda {
bool compiled() noexcept { return false; }
int device_count() noexcept { return 0; }
std::string unavailable_reason() { return "not built with CUDA"; }
int driver_version() noexcept { return 0; }
int runtime_version() noexcept { return 0; }
std::string device_name(int) { not_built("device_name"); }
int current_device() { not_built("current_device"); }
void set_device(int) { not_built("set_device"); }
DeviceGuard::DeviceGuard(int) { not_built("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
Stream Stream::create(int) { not_built("Stream::create"); }
Stream::~Stream() = default;
Stream::Stream(Stream&& o) noexcept : handle_(o.handle_), device_(o.device_) {}
Stream& Stream::operator=(Stream&&) noexcept { return *this; }
void Stream::synchronize() const { not_built("Stream::synchronize"); }
StreamHandle library_stream(int) { not_built("library_stream"); }
void synchronize(StreamHandle) { not_built("synchronize"); }
void memcpy_async(void*, const void*, std::size_t, StreamHandle) { not_built("memcpy"); }
std::shared_ptr<Waitable> record_event(StreamHandle, int) { not_built("record_event"); }
void* malloc_device(std::size_t, int) { not_built("device allocation"); }
void free_device(void*) noexcept {}
void* malloc_host_pinned(std::size_t) { not_built("pinned allocation"); }
void free_host_pinned(void*) noexcept {}
void* malloc_managed(std::size_t, int) { not_built("managed allocation"); }
PointerInfo pointer_info(const void*) noexcept { return {}; }
}  // namespace cuda
}  // namespace shardkit

#include "gemm_internal.hpp"
namespace shardkit::detail {
void cublas_gemm(const GemmArgs&, int, StreamHandle) {
  throw BackendError("CUDA", 0, "gemm on a CUDA array: shardkit was built without CUDA (SHARDKIT_CUDA=OFF)");
}
}  // namespace shardkit::detail
