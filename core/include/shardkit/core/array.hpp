#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/device.hpp"
#include "shardkit/core/dtype.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/shape.hpp"

namespace shardkit {

class Waitable;

/// An n-dimensional array in host or CUDA memory: shape, strides (in elements), dtype, device, a data pointer, and
/// shared ownership of its storage. Copying an Array makes another handle to the same storage (like a NumPy view);
/// use clone() for a deep copy.
///
/// Storage is either an owning allocation made by shardkit or a borrowed buffer kept alive by an owner handle (a
/// DLPack producer's deleter, a Python object, ...). An Array may carry a ready event: the operation that writes
/// it may still be in flight, and every host access through the library (to_host, to_vector, DLPack export,
/// to_string) waits for it.
class Array {
 public:
  /// An empty 0-element float32 array on the host.
  Array();

  /// Allocates uninitialised contiguous storage. @throws InvalidArgument for negative dimensions.
  static Array empty(Shape shape, DType dtype, Device device = Device::cpu());
  /// Allocates contiguous storage filled with zeros.
  static Array zeros(Shape shape, DType dtype, Device device = Device::cpu());
  /// Wraps memory owned elsewhere. `owner` keeps it alive (nullptr: the caller guarantees the lifetime).
  /// @param strides  element strides; empty means contiguous.
  static Array borrow(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner,
                      Strides strides = {}, bool read_only = false);
  /// An array of this shape and dtype with no storage (every element aliases one byte that must not be written), for
  /// checks that read shapes and dtypes only, such as Communicator::check_value on a traced value.
  static Array shape_only(Shape shape, DType dtype, Device device = Device::cpu());
  /// A contiguous host array holding a copy of `values` with the given shape (1-d when shape is empty).
  template <typename T>
  static Array from_values(std::span<const T> values, Shape shape = {});
  template <typename T>
  static Array from_values(std::initializer_list<T> values, Shape shape = {}) {
    return from_values<T>(std::span<const T>(values.begin(), values.size()), std::move(shape));
  }
  /// A contiguous array 0, 1, 2, ... of `n` elements (arange), on the host unless `device` says otherwise.
  static Array arange(std::int64_t n, DType dtype, Device device = Device::cpu());

  const Shape& shape() const noexcept { return shape_; }
  const Strides& strides() const noexcept { return strides_; }
  int ndim() const noexcept { return static_cast<int>(shape_.size()); }
  /// Size of dimension `d` (negative counts from the end). @throws InvalidArgument when out of range.
  std::int64_t dim(int d) const;
  std::int64_t numel() const noexcept { return numel_; }
  std::size_t itemsize() const noexcept { return dtype_size(dtype_); }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel_) * itemsize(); }
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  void* data() const noexcept { return data_; }
  template <typename T>
  T* data_as() const;
  /// True when the elements are laid out row-major without gaps (always true for 0 or 1 elements).
  bool is_contiguous() const noexcept;
  /// True when the producer forbade writes (DLPack read-only flag). Library calls that would write raise.
  bool read_only() const noexcept { return read_only_; }
  /// The owner handle that keeps the storage alive.
  const std::shared_ptr<void>& storage() const noexcept { return storage_; }

  /// A view of elements [start, stop) along dimension `d`. @throws InvalidArgument when out of range.
  Array slice(int d, std::int64_t start, std::int64_t stop) const;
  /// A view of index `i` along dimension `d`, with that dimension removed.
  Array select(int d, std::int64_t i) const;
  /// A view with another shape of the same element count. @throws InvalidArgument if not contiguous.
  Array reshape(Shape shape) const;
  /// A view with dimensions permuted (`axes[i]` is the source dimension of result dimension i).
  Array permute(const std::vector<int>& axes) const;
  /// This array if contiguous, else a contiguous copy on the same device.
  Array contiguous() const;
  /// A contiguous deep copy on the same device.
  Array clone() const;
  /// A contiguous copy on `device` (or this array when it is already there and contiguous).
  Array to(Device device) const;
  /// Copies `src` into this array (same shape and dtype, any devices and strides). Waits for both ready events.
  /// @throws InvalidArgument on shape/dtype mismatch or when this array is read-only.
  void copy_from(const Array& src);
  /// Sets every element to zero.
  void fill_zero();

  /// Host copy of the elements in row-major order. Waits for the ready event.
  template <typename T>
  std::vector<T> to_vector() const;

  /// Points this array at other memory laid out the same way (shape, strides, dtype, device): for views re-made on
  /// every call over buffers that only move, such as the XLA handler's. The owner and the ready event are dropped:
  /// the caller guarantees the memory's lifetime and readiness.
  void retarget(void* data) noexcept {
    data_ = data;
    storage_.reset();
    ready_.reset();
  }

  /// Attaches the event that must complete before the data may be read.
  void set_ready(std::shared_ptr<Waitable> ready) { ready_ = std::move(ready); }
  /// The pending event, or nullptr when the data is ready.
  const std::shared_ptr<Waitable>& ready_event() const noexcept { return ready_; }
  /// Blocks until the ready event (if any) completes; then clears it. May rethrow the operation's error.
  void wait_ready() const {
    if (ready_) wait_for_ready_event();
  }

  /// NumPy-like text of the elements (waits for the ready event), e.g. "[[0 1]\n [2 3]]".
  std::string to_string() const;
  /// "Array(shape=(2, 3), dtype=float32, device=cpu)".
  std::string describe() const;

 private:
  // Every field at once (no default construction first: this is on the hot path of every collective's result).
  Array(Shape shape, Strides strides, DType dtype, Device device, void* data, std::shared_ptr<void> storage,
        bool read_only);
  void init_layout();
  void wait_for_ready_event() const;

  Shape shape_;
  Strides strides_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::cpu();
  void* data_ = nullptr;
  std::shared_ptr<void> storage_;
  bool read_only_ = false;
  mutable std::shared_ptr<Waitable> ready_;
};

/// Copies elements between arrays of equal shape and dtype on any devices (host strided copy, CUDA copy or kernel).
/// Waits for both arrays' ready events first.
void copy(const Array& src, Array& dst);

// ---- template definitions ----------------------------------------------------------------------------------------

template <typename T>
T* Array::data_as() const {
  SHARDKIT_CHECK(dtype_of<T> == dtype_, "data_as<", dtype_of<T>, ">() on an array of dtype ", dtype_);
  return static_cast<T*>(data_);
}

template <typename T>
Array Array::from_values(std::span<const T> values, Shape shape) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
  Array out = empty(std::move(shape), dtype_of<T>);
  SHARDKIT_CHECK_EQ(out.numel(), static_cast<std::int64_t>(values.size()), "from_values: shape does not match");
  T* dst = out.data_as<T>();
  for (std::size_t i = 0; i < values.size(); ++i) dst[i] = values[i];
  return out;
}

template <typename T>
std::vector<T> Array::to_vector() const {
  SHARDKIT_CHECK(dtype_of<T> == dtype_, "to_vector<", dtype_of<T>, ">() on an array of dtype ", dtype_);
  Array host = Array::empty(shape_, dtype_, Device::cpu());
  host.copy_from(*this);
  const T* p = host.data_as<T>();
  return std::vector<T>(p, p + numel_);
}

}  // namespace shardkit
