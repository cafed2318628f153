#include "shardkit/core/array.hpp"

#include <cstring>

#include "allocate.hpp"
#include "kernels_internal.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit {

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
  std::shared_ptr<void> storage = detail::allocate(bytes, device);
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

Array Array::shape_only(Shape shape, DType dtype, Device device) {
  static std::byte nothing;
  Strides zeros(shape.size(), 0);
  return borrow(&nothing, std::move(shape), dtype, device, nullptr, std::move(zeros));
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
  SHARDKIT_CHECK(0 <= start && start <= stop && stop <= shape_[d], "slice [", start, ", ", stop,
                 ") out of range for dimension ", d, " of size ", shape_[d]);
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
  SHARDKIT_CHECK_EQ(shape_numel(shape), numel_, "reshape from ", shape_to_string(shape_), " to ",
                    shape_to_string(shape));
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

}  // namespace shardkit
