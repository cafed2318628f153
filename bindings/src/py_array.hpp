#pragma once

// Arrays between Python and C++. Any DLPack producer comes in without a copy (NumPy, JAX, PyTorch, CuPy, Warp, our own
// Array); results go back in the caller's framework: NumPy arrays are made directly, other frameworks get our
// Array object through their from_dlpack (registered from Python by shardkit._arrays).

#include <nanobind/nanobind.h>

#include <optional>

#include "shardkit/core/array.hpp"

namespace shardkit::py {

namespace nb = nanobind;

/// Where an array came from, so a result can go back there.
enum class Framework { kNumpy, kJax, kTorch, kCupy, kWarp, kShardkit, kOther };
const char* framework_name(Framework f) noexcept;

/// The framework of a Python object, from its type's module.
Framework framework_of(nb::handle obj);

/// Imports `obj` (a DLPack producer, a DLPack capsule, a Python or NumPy scalar, or anything numpy.asarray takes)
/// without copying where the producer allows. The result is marked read-only: shardkit never writes into inputs.
/// @throws InvalidArgument for objects that cannot be imported (with the producer's reason).
Array array_from_py(nb::handle obj, Framework* framework = nullptr);

/// NumPy's ndarray type (set when the module loads: register_arrays).
extern PyTypeObject* g_ndarray_type;
/// Whether `obj` is exactly a NumPy ndarray (a pointer compare: on every call's hot path).
inline bool is_ndarray(nb::handle obj) { return Py_TYPE(obj.ptr()) == g_ndarray_type; }

/// A NumPy ndarray (exactly that type) imported directly, read-only; nothing for other objects and for dtypes or layouts
/// the DLPack path handles. With `owned` false the Array holds no reference: for a call that holds `obj` itself and
/// drops every handle to the Array before it returns.
std::optional<Array> numpy_input(nb::handle obj, bool owned);

/// A new uninitialised C-contiguous NumPy array (stored in `out`) and an Array over its memory (`owned` as above).
Array numpy_empty(Shape shape, DType dtype, nb::object* out, bool owned = true);

/// Returns `a` as an object of `framework`: a NumPy array made directly (sharing memory), or, for other frameworks,
/// the converter registered for it applied to our Array object. Waits for the array's ready event.
/// `read_only`: a NumPy result refuses writes (for views of memory shardkit still uses, such as local blocks).
nb::object array_to_py(Array a, Framework framework, bool read_only = false);

/// Returns `a` as a NumPy array sharing its memory (a host copy first for device arrays).
nb::object to_numpy(Array a, bool read_only = false);

/// DLPack capsule of `a` (versioned when `versioned`), for __dlpack__. `stream`: the consumer's CUDA stream
/// (or -1 for none), ordered after the array's pending work.
nb::object to_capsule(const Array& a, bool versioned, long long stream);

// ---- JAX arrays on the host (py_array_jax.cpp) ---------------------------------------------------------------------

/// jaxlib's ArrayImpl type, once the JAX layer has loaded (nullptr before).
extern PyTypeObject* g_jax_array_type;
/// Whether `obj` is exactly a jax.Array (ArrayImpl) and the JAX layer has loaded: a pointer compare.
inline bool is_jax_array(nb::handle obj) { return g_jax_array_type && Py_TYPE(obj.ptr()) == g_jax_array_type; }

/// A single-device CPU jax.Array imported through the buffer protocol (ready, read-only, holding jaxlib's reference
/// to the buffer); nothing for arrays that do not export that way (bfloat16, other devices, deleted arrays), which
/// DLPack imports or rejects with JAX's own error.
std::optional<Array> jax_host_input(nb::handle obj);

/// A host Array as a jax.Array on the CPU device that owns its memory from now on (no copy); a null object when the
/// JAX layer has not installed jaxlib's importer or `a` is not in host memory (the caller converts through DLPack).
/// The dtype is kept as is: for results of operations on jax.Arrays, whose dtype JAX made.
nb::object jax_host_result(const Array& a);

/// Installs the JAX side (shardkit.jax._ops): ArrayImpl's type and jaxlib's DLPack importer, called as
/// importer(capsule, *importer_args); importer None keeps the DLPack converter. The references stay borrowed.
void set_jax_host(nb::handle array_type, nb::handle importer, nb::handle importer_args);

/// Registers the module's functions and the Array class.
void register_arrays(nb::module_& m);

}  // namespace shardkit::py
