// JAX arrays on the host, in and out without DLPack's Python round trip. jax.Array.__dlpack__ and
// jax.dlpack.from_dlpack are Python functions that cost many times a small collective; an eager shardkit.mpi call on
// a jax.Array needs neither:
//  - in: a single-device CPU jax.Array speaks the Python buffer protocol (jaxlib waits for the array to be ready, and
//    holds the buffer until the view is released). Dtypes it does not export that way (bfloat16), other devices and
//    deleted arrays fail here, and the caller takes the DLPack path, which handles them or raises the producer's error.
//  - out: a result shardkit allocated (64-byte aligned, as XLA:CPU needs to alias it) goes to jaxlib's DLPack importer
//    as a legacy capsule: the new jax.Array owns the memory through the capsule's deleter, and shardkit never writes
//    it again. The importer is found by shardkit.jax._compat; without it the framework's converter (jax.dlpack) is
//    used.

#include <string_view>

#include "py_array.hpp"
#include "shardkit/core/dtype.hpp"

namespace shardkit::py {

PyTypeObject* g_jax_array_type = nullptr;

namespace {

// jaxlib's DLPack import, called as importer(capsule, *importer_args) (borrowed: shardkit._core holds them).
PyObject* g_importer = nullptr;
PyObject* g_importer_args = nullptr;

// The dtype of a PEP 3118 element format and size ("=d", "<f", "Zf", "?"), or nothing for formats shardkit does not
// take from a buffer (big-endian, structured, unknown codes).
std::optional<DType> buffer_dtype(const char* format, Py_ssize_t itemsize) {
  std::string_view f = format ? format : "B";
  if (!f.empty() && (f.front() == '@' || f.front() == '=' || f.front() == '<')) f.remove_prefix(1);
  const bool complex = !f.empty() && f.front() == 'Z';
  if (complex) f.remove_prefix(1);
  if (f.size() != 1) return std::nullopt;
  const char c = f.front();
  const Py_ssize_t n = itemsize;
  if (complex) {
    if (c == 'f' && n == 8) return DType::kComplex64;
    if (c == 'd' && n == 16) return DType::kComplex128;
    return std::nullopt;
  }
  switch (c) {
    case '?':
      return n == 1 ? std::optional(DType::kBool) : std::nullopt;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q': {
      // The integer of that size: the format letter says only signed (lower case) or not, the item size the width.
      const int width = n == 1 ? 0 : n == 2 ? 1 : n == 4 ? 2 : n == 8 ? 3 : -1;
      if (width < 0) return std::nullopt;
      constexpr DType kSigned[] = {DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64};
      constexpr DType kUnsigned[] = {DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64};
      return (c >= 'a' ? kSigned : kUnsigned)[width];
    }
    case 'e':
      return n == 2 ? std::optional(DType::kFloat16) : std::nullopt;
    case 'f':
      return n == 4 ? std::optional(DType::kFloat32) : std::nullopt;
    case 'd':
      return n == 8 ? std::optional(DType::kFloat64) : std::nullopt;
    default:
      return std::nullopt;
  }
}

// Releases a buffer view with the GIL held (the last Array handle may go on a thread that released it).
void release_view(void* p) {
  auto* view = static_cast<Py_buffer*>(p);
  if (Py_IsInitialized()) {  // the interpreter is gone: leaking beats calling into a dead runtime
    PyGILState_STATE s = PyGILState_Ensure();
    PyBuffer_Release(view);
    PyGILState_Release(s);
  }
  delete view;
}

}  // namespace

std::optional<Array> jax_host_input(nb::handle obj) {
  auto* view = new Py_buffer();
  if (PyObject_GetBuffer(obj.ptr(), view, PyBUF_RECORDS_RO) != 0) {
    delete view;
    PyErr_Clear();  // not exportable this way: the caller goes through DLPack
    return std::nullopt;
  }
  std::shared_ptr<void> owner(view, release_view);
  const std::optional<DType> dtype = buffer_dtype(view->format, view->itemsize);
  if (!dtype) return std::nullopt;
  const int nd = view->ndim;
  Shape shape(view->shape, view->shape + nd);
  Strides strides;  // empty: contiguous
  if (view->strides && !PyBuffer_IsContiguous(view, 'C')) {
    strides.resize(static_cast<std::size_t>(nd));
    for (int i = 0; i < nd; ++i) {
      if (view->strides[i] < 0 || view->strides[i] % view->itemsize != 0) return std::nullopt;
      strides[i] = view->strides[i] / view->itemsize;
    }
  }
  return Array::borrow(view->buf, std::move(shape), *dtype, Device::cpu(), std::move(owner), std::move(strides),
                       /*read_only=*/true);
}

nb::object jax_host_result(const Array& a) {
  if (!g_importer || a.device().kind != DeviceKind::kCPU) return nb::object();
  nb::object capsule = to_capsule(a, /*versioned=*/false, -1);  // jaxlib takes legacy capsules; waits for `a`
  constexpr Py_ssize_t kMaxArgs = 8;
  const Py_ssize_t extra = PyTuple_GET_SIZE(g_importer_args);
  SHARDKIT_CHECK_LT(extra, kMaxArgs, "too many arguments for the JAX importer");
  PyObject* args[kMaxArgs];
  args[0] = capsule.ptr();
  for (Py_ssize_t i = 0; i < extra; ++i) args[i + 1] = PyTuple_GET_ITEM(g_importer_args, i);
  PyObject* r = PyObject_Vectorcall(g_importer, args, static_cast<std::size_t>(extra + 1), nullptr);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

void set_jax_host(nb::handle array_type, nb::handle importer, nb::handle importer_args) {
  g_jax_array_type = reinterpret_cast<PyTypeObject*>(array_type.ptr());
  const bool usable = !importer.is_none() && PyTuple_Check(importer_args.ptr());
  g_importer = usable ? importer.ptr() : nullptr;
  g_importer_args = usable ? importer_args.ptr() : nullptr;
}

}  // namespace shardkit::py
