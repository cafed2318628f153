#include "shardkit/core/array.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

#include <sys/mman.h>

#include "kernels_internal.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit {

// ---- shapes ------------------------------------------------------------------------------------------------------

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // Past 64 bits only for an empty shape (every stride of a non-empty one is at most its element count), whose
    // strides address nothing: saturate rather than overflow.
    if (__builtin_mul_overflow(s, std::max<std::int64_t>(shape[i], 1), &s)) s = INT64_MAX;
  }
  return strides;
}

std::int64_t shape_numel(const Shape& shape) {
  bool empty = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    SHARDKIT_CHECK_GE(shape[i], 0, "negative dimension ", i, " in shape ", shape_to_string(shape));
    empty = empty || shape[i] == 0;
  }
  // A zero anywhere makes the array empty, whatever the order of the dimensions.
  if (empty) return 0;
  std::int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n))
      throw InvalidArgument("shape " + shape_to_string(shape) + " has more elements than fit in 64 bits");
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// ---- allocation --------------------------------------------------------------------------------------------------

namespace {

constexpr std::size_t kHostAlignment = 64;

// Large host buffers (GEMM operands and results, whole shards) come straight from mmap, 2 MiB aligned and marked for
// transparent huge pages: glibc maps allocations this large afresh each time anyway, and faulting 4 KiB pages in
// costs ~1 ms per MiB on first touch (55 ms for 64 MiB here), huge pages ~8x less. Below this size glibc's heap
// reuses freed memory, which is cheaper still. Where the kernel ignores the advice, this is an ordinary mapping.
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kLargeHostAllocation = std::size_t{32} << 20;

std::shared_ptr<void> allocate_large_host(std::size_t bytes) {
  const std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw BackendError("host", 0, detail::concat("out of host memory allocating ", bytes, " bytes"));
  // Keep the 2 MiB aligned part, give back the slack on either side.
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  if (const std::size_t tail = start + size + kHugePage - (aligned + size); tail > 0)
    munmap(reinterpret_cast<void*>(aligned + size), tail);
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  (void)madvise(p, size, MADV_HUGEPAGE);  // advice only: nothing to do when it is refused
#endif
  try {
    return std::shared_ptr<void>(p, [size](void* q) { munmap(q, size); });
  } catch (...) {
    munmap(p, size);
    throw;
  }
}

std::shared_ptr<void> allocate(std::size_t bytes, Device device) {
  // Never hand out a null pointer, even for empty arrays: some consumers treat null data as malformed.
  const std::size_t n = std::max<std::size_t>(bytes, 1);
  switch (device.kind) {
    case DeviceKind::kCPU: {
      if (n >= kLargeHostAllocation) return allocate_large_host(n);
      // One allocation for the control block and the (uninitialised, 64-byte aligned) data: every collective's
      // result is made here, and small ones are dominated by allocator work.
      struct alignas(kHostAlignment) Line {
        std::byte b[kHostAlignment];
      };
      try {
        return std::make_shared_for_overwrite<Line[]>((n + kHostAlignment - 1) / kHostAlignment);
      } catch (const std::bad_alloc&) {
        throw BackendError("host", 0, detail::concat("out of host memory allocating ", bytes, " bytes"));
      }
    }
    case DeviceKind::kCUDA:
      return std::shared_ptr<void>(cuda::malloc_device(n, device.index), [](void* q) { cuda::free_device(q); });
    case DeviceKind::kCUDAHost:
      return std::shared_ptr<void>(cuda::malloc_host_pinned(n), [](void* q) { cuda::free_host_pinned(q); });
    case DeviceKind::kCUDAManaged:
      break;
  }
  return std::shared_ptr<void>(cuda::malloc_managed(n, device.index), [](void* q) { cuda::free_device(q); });
}

int normalize_dim(int d, int ndim, const char* what) {
  if (d < 0) d += ndim;
  SHARDKIT_CHECK(d >= 0 && d < ndim, what, ": dimension ", d, " out of range for an array of rank ", ndim);
  return d;
}

}  // namespace

// ---- construction ------------------------------------------------------------------------------------------------

Array::Array() : shape_{0} { init_layout(); }

Array::Array(Shape shape, Strides strides, DType dtype, Device device, void* data, std::shared_ptr<void> storage,
             bool read_only)
    : shape_(std::move(shape)),
      strides_(std::move(strides)),
      dtype_(dtype),
      device_(device),
      data_(data),
      storage_(std::move(storage)),
      read_only_(read_only) {
  init_layout();
}

void Array::init_layout() {
  numel_ = shape_numel(shape_);
  if (strides_.empty()) strides_ = contiguous_strides(shape_);
  SHARDKIT_CHECK_EQ(strides_.size(), shape_.size(), "strides and shape have different ranks");
}

Array Array::empty(Shape shape, DType dtype, Device device) {
  const std::int64_t n = shape_numel(shape);
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(n), dtype_size(dtype), &bytes))
    throw InvalidArgument("array of shape " + shape_to_string(shape) + " is too large");
  std::shared_ptr<void> storage = allocate(bytes, device);
  void* data = storage.get();
  return Array(std::move(shape), Strides{}, dtype, device, data, std::move(storage), false);
}

Array Array::zeros(Shape shape, DType dtype, Device device) {
  Array a = empty(std::move(shape), dtype, device);
  a.fill_zero();
  return a;
}

Array Array::borrow(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner, Strides strides,
                    bool read_only) {
  Array a(std::move(shape), std::move(strides), dtype, device, data, std::move(owner), read_only);
  SHARDKIT_CHECK(data != nullptr || a.numel_ == 0, "borrowed array of shape ", shape_to_string(a.shape_),
                 " has a null data pointer");
  for (std::size_t i = 0; i < a.strides_.size(); ++i)
    SHARDKIT_CHECK_GE(a.strides_[i], 0, "negative stride in dimension ", i, " is not supported");
  return a;
}

Array Array::arange(std::int64_t n, DType dtype, Device device) {
  SHARDKIT_CHECK_GE(n, 0, "arange of a negative length");
  Array host = empty({n}, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(host.data_);
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, Half>)
        p[i] = float_to_half(static_cast<float>(i));
      else if constexpr (std::is_same_v<T, BFloat16>)
        p[i] = float_to_bfloat16(static_cast<float>(i));
      else if constexpr (std::is_same_v<T, bool>)
        p[i] = (i % 2) != 0;
      else
        p[i] = static_cast<T>(i);
    }
  });
  return device == Device::cpu() ? host : host.to(device);
}

// ---- properties and views ------------------------------------------------------------------------------------------

std::int64_t Array::dim(int d) const { return shape_[normalize_dim(d, ndim(), "dim")]; }

bool Array::is_contiguous() const noexcept {
  if (numel_ <= 1) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Array Array::slice(int d, std::int64_t start, std::int64_t stop) const {
  d = normalize_dim(d, ndim(), "slice");
  SHARDKIT_CHECK(0 <= start && start <= stop && stop <= shape_[d], "slice [", start, ", ", stop, ") out of range for dimension ",
                 d, " of size ", shape_[d]);
  Array v = *this;
  v.shape_[d] = stop - start;
  v.numel_ = shape_numel(v.shape_);
  if (v.numel_ > 0) v.data_ = static_cast<char*>(data_) + start * strides_[d] * static_cast<std::int64_t>(itemsize());
  return v;
}

Array Array::select(int d, std::int64_t i) const {
  d = normalize_dim(d, ndim(), "select");
  Array v = slice(d, i, i + 1);
  v.shape_.erase(v.shape_.begin() + d);
  v.strides_.erase(v.strides_.begin() + d);
  v.numel_ = shape_numel(v.shape_);
  return v;
}

Array Array::reshape(Shape shape) const {
  SHARDKIT_CHECK_EQ(shape_numel(shape), numel_, "reshape from ", shape_to_string(shape_), " to ", shape_to_string(shape));
  SHARDKIT_CHECK(is_contiguous(), "reshape of a non-contiguous array; call contiguous() first");
  Array v = *this;
  v.shape_ = std::move(shape);
  v.strides_ = contiguous_strides(v.shape_);
  return v;
}

Array Array::permute(const std::vector<int>& axes) const {
  SHARDKIT_CHECK_EQ(static_cast<int>(axes.size()), ndim(), "permute needs one axis per dimension");
  std::vector<bool> seen(axes.size(), false);
  Array v = *this;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const int a = normalize_dim(axes[i], ndim(), "permute");
    SHARDKIT_CHECK(!seen[a], "permute: axis ", a, " repeated");
    seen[a] = true;
    v.shape_[i] = shape_[a];
    v.strides_[i] = strides_[a];
  }
  return v;
}

Array Array::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Array Array::clone() const {
  Array out = empty(shape_, dtype_, device_);
  out.copy_from(*this);
  return out;
}

Array Array::to(Device device) const {
  wait_ready();
  if (device == device_ && is_contiguous()) return *this;
  Array out = empty(shape_, dtype_, device);
  out.copy_from(*this);
  return out;
}

void Array::copy_from(const Array& src) { copy(src, *this); }

void Array::fill_zero() {
  SHARDKIT_CHECK(!read_only_, "cannot write into a read-only array");
  wait_ready();
  if (numel_ == 0) return;
  if (!is_contiguous()) {
    Array zero = zeros(shape_, dtype_, device_);
    copy_from(zero);
    return;
  }
  if (device_.kind == DeviceKind::kCUDA) {
    StreamHandle s = cuda::library_stream(device_.index);
    detail::cuda_memset_zero(data_, nbytes(), s);
    cuda::synchronize(s);
  } else {
    std::memset(data_, 0, nbytes());
  }
}

void Array::wait_for_ready_event() const {
  // Keep the event alive while waiting, and clear it only once it completed without error.
  std::shared_ptr<Waitable> r = ready_;
  r->wait();
  ready_.reset();
}

std::string Array::describe() const {
  return detail::concat("Array(shape=", shape_to_string(shape_), ", dtype=", dtype_, ", device=", device_,
                        is_contiguous() ? "" : ", strided", read_only_ ? ", read_only" : "", ")");
}

// ---- copies ----------------------------------------------------------------------------------------------------------

namespace {

// Copies between a CUDA-side array and anything else. Pageable host memory is not device-addressable, so a strided
// pageable side is first packed on the host and a strided device side is packed on the device.
void cuda_copy(const Array& src, Array& dst) {
  const int dev = dst.device().kind != DeviceKind::kCPU && dst.device().kind != DeviceKind::kCUDAHost
                      ? dst.device().index
                      : src.device().index;
  const StreamHandle stream = cuda::library_stream(dev);
  const bool src_addressable = src.device().kind != DeviceKind::kCPU;
  const bool dst_addressable = dst.device().kind != DeviceKind::kCPU;

  if (src.is_contiguous() && dst.is_contiguous()) {
    cuda::memcpy_async(dst.data(), src.data(), dst.nbytes(), stream);
    cuda::synchronize(stream);
    return;
  }
  if (src_addressable && dst_addressable) {
    detail::cuda_strided_copy(dst.data(), dst.strides().data(), src.data(), src.strides().data(), dst.shape().data(),
                              dst.ndim(), dst.itemsize(), stream);
    cuda::synchronize(stream);
    return;
  }
  // One side is pageable host memory: stage through a contiguous buffer on the other side's terms.
  if (!src_addressable) {
    Array packed = src.contiguous();            // host pack
    Array staged = Array::empty(src.shape(), src.dtype(), Device::cuda(dev));
    cuda::memcpy_async(staged.data(), packed.data(), packed.nbytes(), stream);
    detail::cuda_strided_copy(dst.data(), dst.strides().data(), staged.data(), staged.strides().data(),
                              dst.shape().data(), dst.ndim(), dst.itemsize(), stream);
    cuda::synchronize(stream);
    return;
  }
  Array packed = Array::empty(src.shape(), src.dtype(), Device::cuda(dev));
  detail::cuda_strided_copy(packed.data(), packed.strides().data(), src.data(), src.strides().data(),
                            src.shape().data(), src.ndim(), src.itemsize(), stream);
  Array host = Array::empty(src.shape(), src.dtype(), Device::cpu());
  cuda::memcpy_async(host.data(), packed.data(), packed.nbytes(), stream);
  cuda::synchronize(stream);
  detail::host_strided_copy(dst.data(), dst.strides().data(), host.data(), host.strides().data(), dst.shape().data(),
                            dst.ndim(), dst.itemsize());
}

}  // namespace

void copy(const Array& src, Array& dst) {
  SHARDKIT_CHECK(src.shape() == dst.shape(), "copy: shapes differ: ", shape_to_string(src.shape()), " vs ",
                 shape_to_string(dst.shape()));
  SHARDKIT_CHECK(src.dtype() == dst.dtype(), "copy: dtypes differ: ", src.dtype(), " vs ", dst.dtype());
  SHARDKIT_CHECK(!dst.read_only(), "cannot write into a read-only array");
  src.wait_ready();
  dst.wait_ready();
  if (src.numel() == 0 || src.data() == dst.data()) return;
  if (src.device().is_host_accessible() && dst.device().is_host_accessible()) {
    detail::host_strided_copy(dst.data(), dst.strides().data(), src.data(), src.strides().data(), dst.shape().data(),
                              dst.ndim(), dst.itemsize());
    return;
  }
  cuda_copy(src, dst);
}

namespace detail {

void host_strided_copy(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem_size) {
  std::int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) numel *= shape[i];
  if (numel == 0) return;
  // Fold trailing dimensions that are contiguous in both layouts into one memcpy run.
  int inner = ndim;
  std::int64_t run = 1;
  while (inner > 0 && dst_strides[inner - 1] == run && src_strides[inner - 1] == run) {
    run *= shape[inner - 1];
    --inner;
  }
  const std::size_t run_bytes = static_cast<std::size_t>(run) * elem_size;
  if (inner == 0) {
    std::memcpy(dst, src, run_bytes);
    return;
  }
  // Odometer over the outer dimensions [0, inner).
  std::vector<std::int64_t> idx(inner, 0);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const auto es = static_cast<std::int64_t>(elem_size);
  const std::int64_t outer_count = numel / run;
  for (std::int64_t n = 0; n < outer_count; ++n) {
    std::int64_t doff = 0, soff = 0;
    for (int k = 0; k < inner; ++k) {
      doff += idx[k] * dst_strides[k];
      soff += idx[k] * src_strides[k];
    }
    if (run == 1) {
      std::memcpy(d + doff * es, s + soff * es, elem_size);
    } else {
      std::memcpy(d + doff * es, s + soff * es, run_bytes);
    }
    for (int k = inner - 1; k >= 0; --k) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace detail

// ---- comparison --------------------------------------------------------------------------------------------------

namespace {

template <typename T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return half_to_float(v);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return bfloat16_to_float(v);
  else
    return static_cast<double>(v);
}

}  // namespace

bool allclose(const Array& a, const Array& b, double rtol, double atol) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Array ha = a.to(Device::cpu());
  const Array hb = b.to(Device::cpu());
  return visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(ha.data());
    const T* pb = static_cast<const T*>(hb.data());
    for (std::int64_t i = 0; i < ha.numel(); ++i) {
      if constexpr (std::is_integral_v<T>) {
        if (pa[i] != pb[i]) return false;
      } else if constexpr (requires { pa[i].real(); }) {
        if (std::abs(pa[i] - pb[i]) > atol + rtol * std::abs(pb[i])) return false;
      } else {
        const double x = as_double(pa[i]), y = as_double(pb[i]);
        if (std::isnan(x) || std::isnan(y) || std::abs(x - y) > atol + rtol * std::abs(y)) return false;
      }
    }
    return true;
  });
}

double max_relative_error(const Array& a, const Array& b) {
  SHARDKIT_CHECK(a.shape() == b.shape(), "max_relative_error: shapes differ: ", shape_to_string(a.shape()), " vs ",
                 shape_to_string(b.shape()));
  SHARDKIT_CHECK(a.dtype() == b.dtype(), "max_relative_error: dtypes differ");
  const Array ha = a.to(Device::cpu());
  const Array hb = b.to(Device::cpu());
  double worst = 0.0, scale = 0.0;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (requires(T v) { v.real(); }) {
      const T* pa = static_cast<const T*>(ha.data());
      const T* pb = static_cast<const T*>(hb.data());
      for (std::int64_t i = 0; i < ha.numel(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(pa[i] - pb[i])));
        scale = std::max(scale, static_cast<double>(std::abs(pb[i])));
      }
    } else {
      const T* pa = static_cast<const T*>(ha.data());
      const T* pb = static_cast<const T*>(hb.data());
      for (std::int64_t i = 0; i < ha.numel(); ++i) {
        const double x = as_double(pa[i]), y = as_double(pb[i]);
        worst = std::max(worst, std::isnan(x - y) ? INFINITY : std::abs(x - y));
        scale = std::max(scale, std::abs(y));
      }
    }
  });
  // Relative to the largest reference magnitude: the error measure GEMM checks use (elementwise relative error is
  // meaningless where the reference is near zero).
  return worst / std::max(scale, 1e-300);
}

// ---- printing ------------------------------------------------------------------------------------------------------

namespace {

template <typename T>
std::string format_element(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (requires { v.real(); }) {
    std::ostringstream os;
    os << "(" << format_element(v.real()) << (v.imag() < 0 ? "" : "+") << format_element(v.imag()) << "j)";
    return os.str();
  } else {
    const double x = as_double(v);
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
    // Shortest round-trip text at the element's own precision, NumPy style ("2." for integral values).
    std::to_chars_result r;
    if constexpr (std::is_same_v<T, double>)
      r = std::to_chars(buf, buf + sizeof buf, x);
    else
      r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    std::string s(buf, r.ptr);
    if (s.find_first_of(".e") == std::string::npos) s += ".";
    return s;
  }
}

constexpr std::int64_t kSummarizeThreshold = 1000;
constexpr std::int64_t kEdgeItems = 3;

void format_rec(std::ostringstream& os, const std::vector<std::string>& items, const Shape& shape,
                const Strides& strides, int d, std::int64_t offset, std::size_t width, bool summarize) {
  if (d == static_cast<int>(shape.size())) {
    const std::string& s = items[offset];
    os << std::string(width - s.size(), ' ') << s;
    return;
  }
  os << "[";
  const std::int64_t n = shape[d];
  const bool cut = summarize && n > 2 * kEdgeItems;
  const bool last = d + 1 == static_cast<int>(shape.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdgeItems) {
      if (last)
        os << " ...";
      else
        os << '\n' << std::string(static_cast<std::size_t>(d + 1), ' ') << "...";
      i = n - kEdgeItems;
    }
    if (i > 0 || (cut && i == n - kEdgeItems)) {
      if (last)
        os << " ";
      else
        os << std::string(static_cast<std::size_t>(shape.size() - d - 1), '\n') << std::string(d + 1, ' ');
    }
    format_rec(os, items, shape, strides, d + 1, offset + i * strides[d], width, summarize);
  }
  os << "]";
}

}  // namespace

std::string Array::to_string() const {
  // As NumPy prints any empty array. Walking the dimensions instead would print one "[]" per row of, e.g., a
  // (10**12, 0) array: hours of work and a string of terabytes for an array of no elements.
  if (numel_ == 0) return "[]";
  const Array host = to(Device::cpu());
  std::vector<std::string> items(static_cast<std::size_t>(numel_));
  visit_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.data());
    for (std::int64_t i = 0; i < numel_; ++i) items[i] = format_element(p[i]);
  });
  std::size_t width = 0;
  for (const auto& s : items) width = std::max(width, s.size());
  std::ostringstream os;
  if (ndim() == 0) return numel_ ? items[0] : "[]";
  format_rec(os, items, host.shape(), host.strides(), 0, 0, width, numel_ > kSummarizeThreshold);
  return os.str();
}

}  // namespace shardkit
