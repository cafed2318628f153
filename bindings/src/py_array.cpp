#include "py_array.hpp"

// The NumPy C API, used on the hot path only: NumPy arrays in and out without the DLPack round trip (about a
// microsecond each way through Python-level __dlpack__ and from_dlpack).
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL shardkit_numpy_api
#include <numpy/arrayobject.h>
#undef import_array  // NumPy's macro; shardkit's functions are array_from_py / array_to_py

#include <dlpack/dlpack.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <optional>
#include <string_view>

#include "shardkit/core/cuda.hpp"
#include "shardkit/core/dlpack.hpp"
#include "shardkit/core/waitable.hpp"

namespace shardkit::py {
namespace {

constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kLegacyName = "dltensor";
constexpr const char* kUsedVersionedName = "used_dltensor_versioned";
constexpr const char* kUsedLegacyName = "used_dltensor";

// Converters from our Array object into each framework (set by shardkit._arrays at import).
nb::dict& converters() {
  static nb::dict* d = new nb::dict();  // lives as long as the interpreter; never destroyed at static teardown
  return *d;
}

nb::module_& numpy() {
  static nb::module_* np = new nb::module_(nb::module_::import_("numpy"));
  return *np;
}

// An Array's owner that lets the previous owner go with the GIL held: producers' deleters may touch Python objects
// (NumPy's does), and the last reference can drop on a thread that released the GIL.
Array with_gil_owner(const Array& a, bool read_only) {
  auto* inner = new std::shared_ptr<void>(a.storage());
  std::shared_ptr<void> owner(inner, [](void* p) {
    auto* holder = static_cast<std::shared_ptr<void>*>(p);
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leaking beats calling into a dead runtime
    PyGILState_STATE s = PyGILState_Ensure();
    delete holder;
    PyGILState_Release(s);
  });
  return Array::borrow(a.data(), a.shape(), a.dtype(), a.device(), std::move(owner), a.strides(), read_only);
}

Array import_capsule(nb::handle capsule) {
  PyObject* c = capsule.ptr();
  const char* name = PyCapsule_GetName(c);
  if (!name) throw nb::python_error();
  const std::string_view n(name);
  Array a;
  if (n == kVersionedName) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, name));
    a = from_dlpack(t);  // throws InvalidArgument, leaving the capsule (and its deleter) to the producer
    PyCapsule_SetName(c, kUsedVersionedName);
  } else if (n == kLegacyName) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, name));
    a = from_dlpack(t);
    PyCapsule_SetName(c, kUsedLegacyName);
  } else if (n == kUsedVersionedName || n == kUsedLegacyName) {
    throw InvalidArgument("DLPack capsule already consumed (a capsule can be imported once)");
  } else {
    throw InvalidArgument(detail::concat("not a DLPack capsule (capsule name '", n, "')"));
  }
  return with_gil_owner(a, true);
}

// The dtype of a NumPy descriptor, or nothing for kinds shardkit does not know (ml_dtypes' bfloat16 among them).
std::optional<DType> numpy_dtype(PyArray_Descr* d) {
  const int n = static_cast<int>(PyDataType_ELSIZE(d));
  switch (d->kind) {
    case 'b': return DType::kBool;
    case 'i': return n == 1 ? DType::kInt8 : n == 2 ? DType::kInt16 : n == 4 ? DType::kInt32 : DType::kInt64;
    case 'u': return n == 1 ? DType::kUInt8 : n == 2 ? DType::kUInt16 : n == 4 ? DType::kUInt32 : DType::kUInt64;
    case 'f':
      if (n == 2) return DType::kFloat16;
      if (n == 4) return DType::kFloat32;
      if (n == 8) return DType::kFloat64;
      return std::nullopt;  // long double
    case 'c':
      if (n == 8) return DType::kComplex64;
      if (n == 16) return DType::kComplex128;
      return std::nullopt;
    default: return std::nullopt;
  }
}

int numpy_type_num(DType d) {
  switch (d) {
    case DType::kBool: return NPY_BOOL;
    case DType::kInt8: return NPY_INT8;
    case DType::kInt16: return NPY_INT16;
    case DType::kInt32: return NPY_INT32;
    case DType::kInt64: return NPY_INT64;
    case DType::kUInt8: return NPY_UINT8;
    case DType::kUInt16: return NPY_UINT16;
    case DType::kUInt32: return NPY_UINT32;
    case DType::kUInt64: return NPY_UINT64;
    case DType::kFloat16: return NPY_FLOAT16;
    case DType::kBFloat16: return NPY_UINT16;  // the bits; shardkit._arrays views them as ml_dtypes.bfloat16
    case DType::kFloat32: return NPY_FLOAT32;
    case DType::kFloat64: return NPY_FLOAT64;
    case DType::kComplex64: return NPY_COMPLEX64;
    case DType::kComplex128: break;
  }
  return NPY_COMPLEX128;
}

// The deleter of an owner holding a Python reference: drops it with the GIL held (the last Array handle may go on a
// thread that released the GIL).
void release_with_gil(void* p) {
  if (!Py_IsInitialized()) return;  // the interpreter is gone: leaking beats calling into a dead runtime
  PyGILState_STATE s = PyGILState_Ensure();
  Py_DECREF(static_cast<PyObject*>(p));
  PyGILState_Release(s);
}

// An owner for `o` (a new reference), or none when the caller holds `o` for as long as the Array is used.
std::shared_ptr<void> owner_of(PyObject* o, bool owned) {
  if (!owned) return nullptr;
  Py_INCREF(o);
  return std::shared_ptr<void>(o, release_with_gil);
}

// A NumPy array imported directly: its memory, kept alive by a reference released under the GIL (or borrowed).
std::optional<Array> import_numpy(PyObject* o, bool owned) {
  auto* arr = reinterpret_cast<PyArrayObject*>(o);
  const std::optional<DType> dt = numpy_dtype(PyArray_DESCR(arr));
  if (!dt || PyArray_ISBYTESWAPPED(arr)) return std::nullopt;
  const int nd = PyArray_NDIM(arr);
  const npy_intp* dims = PyArray_DIMS(arr);
  const npy_intp* st = PyArray_STRIDES(arr);
  const auto itemsize = static_cast<npy_intp>(dtype_size(*dt));
  Strides strides;  // empty: contiguous (computed by Array)
  if (!PyArray_IS_C_CONTIGUOUS(arr)) {
    strides.resize(static_cast<std::size_t>(nd));
    for (int i = 0; i < nd; ++i) {
      if (st[i] % itemsize != 0 || st[i] < 0) return std::nullopt;  // unusual layouts take the DLPack path
      strides[i] = st[i] / itemsize;
    }
  }
  return Array::borrow(PyArray_DATA(arr), Shape(dims, dims + nd), *dt, Device::cpu(), owner_of(o, owned),
                       std::move(strides), /*read_only=*/true);
}

bool is_scalar(nb::handle obj) {
  PyObject* o = obj.ptr();
  if (PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o) || PyComplex_Check(o)) return true;
  return framework_of(obj) == Framework::kNumpy && !nb::hasattr(obj, "__dlpack__");
}

std::string object_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

}  // namespace

const char* framework_name(Framework f) noexcept {
  switch (f) {
    case Framework::kNumpy: return "numpy";
    case Framework::kJax: return "jax";
    case Framework::kTorch: return "torch";
    case Framework::kCupy: return "cupy";
    case Framework::kWarp: return "warp";
    case Framework::kShardkit: return "shardkit";
    case Framework::kOther: break;
  }
  return "other";
}

Framework framework_of(nb::handle obj) {
  if (nb::isinstance<Array>(obj)) return Framework::kShardkit;
  PyTypeObject* t = Py_TYPE(obj.ptr());
  const std::string_view name(t->tp_name);
  if (name == "numpy.ndarray") return Framework::kNumpy;
  // The defining module of the type: "jaxlib.xla_extension", "torch", "cupy._core.core", "warp.types", ...
  nb::object mod = nb::getattr(obj.type(), "__module__", nb::none());
  if (!nb::isinstance<nb::str>(mod)) return Framework::kOther;
  const std::string m = nb::cast<std::string>(mod);
  const std::string root = m.substr(0, m.find('.'));
  if (root == "numpy") return Framework::kNumpy;
  if (root == "jax" || root == "jaxlib") return Framework::kJax;
  if (root == "torch") return Framework::kTorch;
  if (root == "cupy") return Framework::kCupy;
  if (root == "warp") return Framework::kWarp;
  return Framework::kOther;
}

Array array_from_py(nb::handle obj, Framework* framework) {
  if (nb::isinstance<Array>(obj)) {
    if (framework) *framework = Framework::kShardkit;
    return nb::cast<Array>(obj);
  }
  if (PyCapsule_CheckExact(obj.ptr())) {
    if (framework) *framework = Framework::kNumpy;
    return import_capsule(obj);
  }
  if (PyArray_CheckExact(obj.ptr())) {
    if (framework) *framework = Framework::kNumpy;
    if (std::optional<Array> a = import_numpy(obj.ptr(), true)) return *std::move(a);
  }
  if (is_jax_array(obj)) {
    if (framework) *framework = Framework::kJax;
    if (std::optional<Array> a = jax_host_input(obj)) return *std::move(a);
    if (nb::cast<bool>(obj.attr("is_deleted")()))  // JAX's DLPack export would fail obscurely
      throw InvalidArgument("cannot use a deleted jax.Array (donated to a jitted function, or deleted)");
  }
  const Framework fw = framework_of(obj);
  if (framework) *framework = fw == Framework::kOther ? Framework::kNumpy : fw;
  if (is_scalar(obj)) return array_from_py(numpy().attr("asarray")(obj));
  if (!nb::hasattr(obj, "__dlpack__")) {
    // Lists, tuples, buffers: whatever NumPy makes of them (a copy), then returned as NumPy.
    nb::object arr;
    try {
      arr = numpy().attr("asarray")(obj);
    } catch (nb::python_error& e) {
      throw InvalidArgument(detail::concat("cannot use an object of type ", object_type_name(obj),
                                           " as an array (no __dlpack__, and numpy.asarray failed: ", e.what(), ")"));
    }
    if (nb::hasattr(arr, "dtype") && nb::cast<std::string>(arr.attr("dtype").attr("name")) == "object")
      throw InvalidArgument(detail::concat("cannot use an object of type ", object_type_name(obj), " as an array"));
    return array_from_py(arr);
  }
  // A CUDA producer makes the data ready on the stream we pass (the DLPack stream rule).
  nb::dict kwargs;
  long long stream = -1;
  int device_type = kDLCPU, device_id = 0;
  if (nb::hasattr(obj, "__dlpack_device__")) {
    nb::tuple dev = nb::cast<nb::tuple>(obj.attr("__dlpack_device__")());
    device_type = nb::cast<int>(dev[0]);
    device_id = nb::cast<int>(dev[1]);
    if (device_type == kDLCUDA || device_type == kDLCUDAManaged) {
      stream = reinterpret_cast<long long>(cuda::library_stream(device_id));
      kwargs["stream"] = stream;
    }
  }
  nb::object capsule;
  try {
    kwargs["max_version"] = nb::make_tuple(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
    capsule = obj.attr("__dlpack__")(**kwargs);
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) {
      if (e.matches(PyExc_BufferError)) {
        // NumPy cannot export ml_dtypes' bfloat16 through DLPack: take its bits and say what they are.
        if (fw == Framework::kNumpy && nb::cast<std::string>(obj.attr("dtype").attr("name")) == "bfloat16") {
          Array bits = array_from_py(obj.attr("view")(numpy().attr("uint16")));
          return Array::borrow(bits.data(), bits.shape(), DType::kBFloat16, bits.device(), bits.storage(),
                               bits.strides(), true);
        }
        throw InvalidArgument(detail::concat("the ", object_type_name(obj), " cannot be exported through DLPack: ", e.what()));
      }
      throw;
    }
    // Producers before the DLPack 1.0 Python protocol reject max_version: ask for a legacy capsule.
    PyDict_DelItemString(kwargs.ptr(), "max_version");
    try {
      capsule = obj.attr("__dlpack__")(**kwargs);
    } catch (nb::python_error& e2) {
      if (e2.matches(PyExc_BufferError))
        throw InvalidArgument(detail::concat("the ", object_type_name(obj), " cannot be exported through DLPack: ", e2.what()));
      throw;
    }
  }
  Array a = import_capsule(capsule);
  if (stream != -1) a.set_ready(cuda::record_event(reinterpret_cast<StreamHandle>(stream), device_id));
  return a;
}

nb::object to_numpy(Array a, bool read_only) {
  if (!a.device().is_host_accessible()) a = a.to(Device::cpu());
  a.wait_ready();
  const int nd = a.ndim();
  SHARDKIT_CHECK_LE(nd, NPY_MAXDIMS, "NumPy arrays have at most ", NPY_MAXDIMS, " dimensions");
  npy_intp dims[NPY_MAXDIMS], strides[NPY_MAXDIMS];
  for (int i = 0; i < nd; ++i) {
    dims[i] = static_cast<npy_intp>(a.shape()[i]);
    strides[i] = static_cast<npy_intp>(a.strides()[i] * static_cast<std::int64_t>(a.itemsize()));
  }
  PyArray_Descr* descr = PyArray_DescrFromType(numpy_type_num(a.dtype()));  // a new reference, stolen below
  const int flags = read_only ? 0 : NPY_ARRAY_WRITEABLE;
  PyObject* arr = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, strides, a.data(), flags, nullptr);
  if (!arr) throw nb::python_error();
  // The NumPy array keeps our storage alive through a capsule holding an Array handle.
  PyObject* base = PyCapsule_New(new Array(std::move(a)), "shardkit.array", [](PyObject* c) {
    delete static_cast<Array*>(PyCapsule_GetPointer(c, "shardkit.array"));
  });
  if (!base || PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(arr), base) < 0) {
    Py_XDECREF(base);
    Py_DECREF(arr);
    throw nb::python_error();
  }
  return nb::steal(arr);
}

nb::object array_to_py(Array a, Framework framework, bool read_only) {
  if (framework == Framework::kNumpy || framework == Framework::kOther) {
    if (a.dtype() != DType::kBFloat16) return to_numpy(std::move(a), read_only);
  }
  if (framework == Framework::kShardkit) return nb::cast(a);
  nb::object conv = converters().get(framework_name(framework), nb::none());
  if (conv.is_none()) return nb::cast(a);
  return conv(nb::cast(a));
}

nb::object to_capsule(const Array& a, bool versioned, long long stream) {
  // The consumer reads on `stream`: the export orders it after our pending work instead of blocking the host.
  const StreamHandle consumer = stream != -1 ? reinterpret_cast<StreamHandle>(stream) : nullptr;
  if (versioned) {
    DLManagedTensorVersioned* t = to_dlpack_versioned(a, false, consumer);
    return nb::steal(PyCapsule_New(t, kVersionedName, [](PyObject* c) {
      // Called when the capsule dies: only an unconsumed capsule still owns its tensor.
      if (PyCapsule_IsValid(c, kVersionedName)) {
        auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, kVersionedName));
        if (t && t->deleter) t->deleter(t);
      }
    }));
  }
  DLManagedTensor* t = to_dlpack_legacy(a, consumer);
  return nb::steal(PyCapsule_New(t, kLegacyName, [](PyObject* c) {
    if (PyCapsule_IsValid(c, kLegacyName)) {
      auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kLegacyName));
      if (t && t->deleter) t->deleter(t);
    }
  }));
}

std::optional<Array> numpy_input(nb::handle obj, bool owned) {
  if (!PyArray_CheckExact(obj.ptr())) return std::nullopt;
  return import_numpy(obj.ptr(), owned);
}

Array numpy_empty(Shape shape, DType dtype, nb::object* out, bool owned) {
  SHARDKIT_CHECK_LE(static_cast<int>(shape.size()), NPY_MAXDIMS, "NumPy arrays have at most ", NPY_MAXDIMS,
                    " dimensions");
  npy_intp dims[NPY_MAXDIMS];
  for (std::size_t i = 0; i < shape.size(); ++i) dims[i] = static_cast<npy_intp>(shape[i]);
  PyObject* arr = PyArray_SimpleNew(static_cast<int>(shape.size()), dims, numpy_type_num(dtype));
  if (!arr) throw nb::python_error();
  *out = nb::steal(arr);
  return Array::borrow(PyArray_DATA(reinterpret_cast<PyArrayObject*>(arr)), std::move(shape), dtype, Device::cpu(),
                       owner_of(arr, owned));
}

PyTypeObject* g_ndarray_type = nullptr;

void init_numpy_api() {
  if (_import_array() < 0) throw nb::python_error();
  g_ndarray_type = &PyArray_Type;
}

void register_arrays(nb::module_& m) {
  init_numpy_api();
  nb::class_<Array>(m, "Array",
                    "A shardkit array (host or GPU memory). Any framework takes it through DLPack: "
                    "numpy.from_dlpack(a), torch.from_dlpack(a), jax.dlpack.from_dlpack(a), ...")
      .def_prop_ro("shape", [](const Array& a) {
        nb::list l;
        for (auto d : a.shape()) l.append(d);
        return nb::tuple(l);
      })
      .def_prop_ro("dtype", [](const Array& a) { return std::string(dtype_name(a.dtype())); })
      .def_prop_ro("device", [](const Array& a) { return a.device().to_string(); })
      .def_prop_ro("ndim", &Array::ndim)
      .def_prop_ro("size", &Array::numel)
      .def_prop_ro("nbytes", &Array::nbytes)
      .def_prop_ro("read_only", &Array::read_only)
      .def_prop_ro("data_ptr", [](const Array& a) { return reinterpret_cast<std::uintptr_t>(a.data()); },
                   "Address of the first element (to check that imports share memory).")
      .def("numpy", [](const Array& a) { return to_numpy(a); }, "A NumPy array sharing the memory (copied from a GPU).")
      .def(
          "__dlpack__",
          [](const Array& a, nb::object stream, nb::object max_version, nb::object dl_device, nb::object copy) {
            Array out = a;
            if (!dl_device.is_none()) {
              nb::tuple d = nb::cast<nb::tuple>(dl_device);
              const int type = nb::cast<int>(d[0]);
              const bool same = (type == kDLCPU && a.device().kind == DeviceKind::kCPU) ||
                                (type == kDLCUDA && a.device().kind == DeviceKind::kCUDA &&
                                 nb::cast<int>(d[1]) == a.device().index);
              if (!same) {
                if (type != kDLCPU || (!copy.is_none() && !nb::cast<bool>(copy)))
                  throw nb::buffer_error("shardkit.Array: cannot export to the requested device without a copy");
                out = a.to(Device::cpu());
              }
            }
            if (!copy.is_none() && nb::cast<bool>(copy) && out.data() == a.data()) out = a.clone();
            bool versioned = false;
            if (!max_version.is_none()) versioned = nb::cast<int>(nb::cast<nb::tuple>(max_version)[0]) >= 1;
            const long long s = stream.is_none() ? -1 : nb::cast<long long>(stream);
            return to_capsule(out, versioned, s);
          },
          nb::kw_only(), nb::arg("stream") = nb::none(), nb::arg("max_version") = nb::none(),
          nb::arg("dl_device") = nb::none(), nb::arg("copy") = nb::none())
      .def("__dlpack_device__",
           [](const Array& a) {
             switch (a.device().kind) {
               case DeviceKind::kCPU: return nb::make_tuple(static_cast<int>(kDLCPU), 0);
               case DeviceKind::kCUDA: return nb::make_tuple(static_cast<int>(kDLCUDA), a.device().index);
               case DeviceKind::kCUDAHost: return nb::make_tuple(static_cast<int>(kDLCUDAHost), 0);
               case DeviceKind::kCUDAManaged: break;
             }
             return nb::make_tuple(static_cast<int>(kDLCUDAManaged), a.device().index);
           })
      .def("__repr__", [](const Array& a) { return a.describe() + "\n" + a.to_string(); });

  m.def("asarray", [](nb::handle obj) { return array_from_py(obj); }, nb::arg("obj"),
        "Imports any DLPack producer (or scalar, or sequence) as a shardkit Array, without a copy when possible.");
  m.def("framework_of", [](nb::handle obj) { return framework_name(framework_of(obj)); }, nb::arg("obj"));
  m.def("export", [](const Array& a, const std::string& framework) {
    for (Framework f : {Framework::kNumpy, Framework::kJax, Framework::kTorch, Framework::kCupy, Framework::kWarp,
                        Framework::kShardkit})
      if (framework == framework_name(f)) return array_to_py(a, f);
    throw InvalidArgument("unknown framework '" + framework + "'");
  }, nb::arg("array"), nb::arg("framework"));
  m.def("_set_converters", [](nb::dict d) { converters() = d; });
}

}  // namespace shardkit::py
