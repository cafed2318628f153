#include "shardkit/core/dlpack.hpp"
#include "shardkit/core/waitable.hpp"

#include <dlpack/dlpack.h>

#include <memory>

static_assert(DLPACK_MAJOR_VERSION >= 1, "shardkit needs a DLPack 1.x header (DLManagedTensorVersioned)");

namespace shardkit {

DLPackVersion dlpack_version() noexcept { return {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}; }

namespace {

// Ranks above this are refused: no producer makes them and they are a sign of a corrupt tensor.
constexpr int kMaxDLPackDims = 64;

struct Validated {
  void* data;
  Shape shape;
  Strides strides;
  DType dtype;
  Device device;
};

Device device_from_dl(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return Device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged:
      // A negative ordinal names no GPU; accepted, it would only fail later, far from the import.
      SHARDKIT_CHECK_GE(d.device_id, 0, "from_dlpack: invalid CUDA device id");
      return d.device_type == kDLCUDA ? Device::cuda(d.device_id) : Device::cuda_managed(d.device_id);
    case kDLCUDAHost: return Device::cuda_host();
    default: break;
  }
  throw InvalidArgument(detail::concat("from_dlpack: unsupported device type ", static_cast<int>(d.device_type),
                                       " (shardkit takes CPU, CUDA, CUDA host and CUDA managed memory)"));
}

DLDevice device_to_dl(Device d) {
  switch (d.kind) {
    case DeviceKind::kCPU: return {kDLCPU, 0};
    case DeviceKind::kCUDA: return {kDLCUDA, d.index};
    case DeviceKind::kCUDAHost: return {kDLCUDAHost, 0};
    case DeviceKind::kCUDAManaged: break;
  }
  return {kDLCUDAManaged, d.index};
}

// Checks everything about a DLTensor before anything is taken over, so a failure leaves ownership with the caller.
Validated validate(const DLTensor& t) {
  SHARDKIT_CHECK(t.ndim >= 0 && t.ndim <= kMaxDLPackDims, "from_dlpack: invalid ndim ", t.ndim);
  SHARDKIT_CHECK(t.ndim == 0 || t.shape != nullptr, "from_dlpack: null shape for ndim ", t.ndim);
  Validated v;
  v.dtype = from_dlpack_type({t.dtype.code, t.dtype.bits, t.dtype.lanes});
  v.device = device_from_dl(t.device);
  v.shape.assign(t.shape, t.shape + t.ndim);
  for (int i = 0; i < t.ndim; ++i)
    SHARDKIT_CHECK_GE(v.shape[i], 0, "from_dlpack: negative size in dimension ", i);
  const std::int64_t numel = shape_numel(v.shape);  // also rejects element counts that overflow
  const auto itemsize = static_cast<std::int64_t>(dtype_size(v.dtype));

  if (t.strides) {
    v.strides.assign(t.strides, t.strides + t.ndim);
  } else {
    v.strides = contiguous_strides(v.shape);  // legacy producers may omit strides for compact tensors
  }
  // Checked for empty tensors too: Array::borrow refuses negative strides whatever the size, and the data pointer
  // is offset whatever the size.
  for (int i = 0; i < t.ndim; ++i)
    SHARDKIT_CHECK_GE(v.strides[i], 0, "from_dlpack: negative stride in dimension ", i, " is not supported");
  SHARDKIT_CHECK(t.byte_offset <= static_cast<std::uint64_t>(INT64_MAX), "from_dlpack: byte offset ", t.byte_offset,
                 " is beyond 64-bit addressing");
  // The farthest element must be addressable: each term and the sum must fit in 64 bits, in bytes.
  std::int64_t extent = 0;
  if (numel > 0) {
    for (int i = 0; i < t.ndim; ++i) {
      std::int64_t term = 0;
      if (__builtin_mul_overflow(v.shape[i] - 1, v.strides[i], &term) || __builtin_add_overflow(extent, term, &extent))
        throw InvalidArgument(detail::concat("from_dlpack: strides overflow (dimension ", i, ", stride ", v.strides[i],
                                             ", size ", v.shape[i], ")"));
    }
    std::int64_t bytes = 0;
    if (__builtin_add_overflow(extent, 1, &bytes) || __builtin_mul_overflow(bytes, itemsize, &bytes) ||
        __builtin_add_overflow(bytes, static_cast<std::int64_t>(t.byte_offset), &bytes))
      throw InvalidArgument("from_dlpack: strides and byte offset address beyond 64 bits");
  }
  SHARDKIT_CHECK(t.byte_offset % static_cast<std::uint64_t>(itemsize) == 0, "from_dlpack: byte offset ",
                 t.byte_offset, " is not a multiple of the element size ", itemsize, " (misaligned)");
  SHARDKIT_CHECK(t.data != nullptr || numel == 0, "from_dlpack: null data pointer for a tensor of ", numel,
                 " elements");
  v.data = t.data ? static_cast<char*>(t.data) + t.byte_offset : nullptr;
  return v;
}

// Runs the producer's deleter when the last Array sharing the storage goes, once armed. It is armed only after the
// Array exists: if anything throws before, from_dlpack reports failure and the caller, who still owns the tensor,
// calls the deleter itself.
template <typename Managed>
struct ImportOwner {
  Managed* tensor;
  bool armed = false;
  explicit ImportOwner(Managed* t) : tensor(t) {}
  ImportOwner(const ImportOwner&) = delete;
  ImportOwner& operator=(const ImportOwner&) = delete;
  ~ImportOwner() {
    if (armed && tensor->deleter) tensor->deleter(tensor);
  }
};

template <typename Managed>
Array import_managed(Managed* tensor, bool read_only) {
  Validated v = validate(tensor->dl_tensor);
  auto owner = std::make_shared<ImportOwner<Managed>>(tensor);
  Array a = Array::borrow(v.data, std::move(v.shape), v.dtype, v.device, owner, std::move(v.strides), read_only);
  // From here on the Array owns the tensor: its deleter runs once, when the last view of the storage goes.
  owner->armed = true;
  return a;
}

// What an exported tensor keeps alive: the array (and so its storage) and the shape/strides arrays it points to.
struct ExportContext {
  Array array;
  Shape shape;
  Strides strides;
};

DLTensor describe(ExportContext& ctx) {
  DLTensor t{};
  t.data = ctx.array.data();
  t.device = device_to_dl(ctx.array.device());
  t.ndim = ctx.array.ndim();
  const DLPackType type = to_dlpack_type(ctx.array.dtype());
  t.dtype = {type.code, type.bits, type.lanes};
  t.shape = ctx.shape.data();
  t.strides = ctx.strides.data();
  t.byte_offset = 0;
  return t;
}

}  // namespace

Array from_dlpack(DLManagedTensorVersioned* tensor) {
  SHARDKIT_CHECK(tensor != nullptr, "from_dlpack: null tensor");
  // A different major version may lay out everything after `version` differently: read nothing else.
  if (tensor->version.major != DLPACK_MAJOR_VERSION)
    throw InvalidArgument(detail::concat("from_dlpack: unsupported DLPack version ", tensor->version.major, ".",
                                         tensor->version.minor, " (this build speaks ", DLPACK_MAJOR_VERSION, ".x)"));
  return import_managed(tensor, (tensor->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
}

Array from_dlpack(DLManagedTensor* tensor) {
  SHARDKIT_CHECK(tensor != nullptr, "from_dlpack: null tensor");
  return import_managed(tensor, false);
}

namespace {
// Before an export: the consumer's stream waits on the device when it names one (DLPack's stream rule), else the host.
void ready_for_consumer(const Array& array, StreamHandle consumer_stream) {
  if (consumer_stream && array.device().is_cuda()) {
    if (array.ready_event()) array.ready_event()->enqueue_wait(consumer_stream);
    return;
  }
  array.wait_ready();
}
}  // namespace

DLManagedTensorVersioned* to_dlpack_versioned(const Array& array, bool read_only, StreamHandle consumer_stream) {
  ready_for_consumer(array, consumer_stream);
  auto ctx = std::make_unique<ExportContext>(ExportContext{array, array.shape(), array.strides()});
  auto managed = std::make_unique<DLManagedTensorVersioned>();
  managed->version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  managed->dl_tensor = describe(*ctx);
  managed->flags = (read_only || array.read_only()) ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  managed->manager_ctx = ctx.release();
  managed->deleter = [](DLManagedTensorVersioned* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
  };
  return managed.release();
}

DLManagedTensor* to_dlpack_legacy(const Array& array, StreamHandle consumer_stream) {
  ready_for_consumer(array, consumer_stream);
  auto ctx = std::make_unique<ExportContext>(ExportContext{array, array.shape(), array.strides()});
  auto managed = std::make_unique<DLManagedTensor>();
  managed->dl_tensor = describe(*ctx);
  managed->manager_ctx = ctx.release();
  managed->deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
  };
  return managed.release();
}

}  // namespace shardkit
