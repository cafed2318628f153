#pragma once

// Communicators between Python and C++: what the binding files share (defined in bind_collectives.cpp).

#include <nanobind/nanobind.h>

#include <memory>
#include <optional>
#include <utility>
#include <unordered_map>
#include <vector>

#include "py_array.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::py {

namespace nb = nanobind;
using CommPtr = std::shared_ptr<Communicator>;

/// The communicator a `comm=` argument names: None (the default, a clone of COMM_WORLD), a shardkit Communicator or
/// an mpi4py communicator (wrapped once and cached on the MPI communicator).
/// @throws InvalidArgument for anything else.
CommPtr comm_from(nb::handle h);

/// The Python object for a token; a complete token is one shared object (no allocation per call).
nb::object token_object(const Token& t);

/// Drops the cached default and mpi4py-wrapping communicators (before MPI_Finalize).
void clear_communicator_caches();

/// True when an operation on host buffers is over when the call returns, failed or not: blocking MPI (no timeout,
/// not async) keeps no reference to its buffers, so NumPy arrays that the calling binding itself holds need no owner.
inline bool completes_in_call(const Communicator& c) {
  return !c.options().async && c.options().timeout.count() == 0;
}

// ---- calls: arrays in, collective without the GIL, results back in the caller's framework ----------------------------

/// The value form `value(array)` on any framework's array; the result goes back to that framework.
template <typename Value>
nb::tuple value_call(nb::handle x, Value&& value) {
  Framework fw;
  Array a = array_from_py(x, &fw);
  std::optional<Result> r;  // not default-constructed: an empty Array allocates
  {
    nb::gil_scoped_release release;
    r.emplace(value(a));
  }
  return nb::make_tuple(array_to_py(std::move(r->value), fw), token_object(r->token));
}

/// The NumPy fast path: for a host NumPy input, a NumPy result of the shape `result_shape(array)` gives, filled in
/// place by `fill(array, out)` (a buffer form) and complete on return, with fill's token; nothing for other inputs.
template <typename ShapeFn, typename Fill>
std::optional<std::pair<nb::object, Token>> numpy_call(const Communicator& c, nb::handle x, ShapeFn&& result_shape,
                                                       Fill&& fill) {
  const bool owned = !completes_in_call(c);
  std::optional<Array> a = numpy_input(x, owned);
  if (!a) return std::nullopt;
  nb::object result;
  Array out = numpy_empty(result_shape(*a), a->dtype(), &result, owned);
  Token t;
  try {
    nb::gil_scoped_release release;
    t = fill(*a, out);
    t.wait();  // NumPy reads the memory right away
  } catch (const InvalidArgument&) {
    throw;  // raised before anything was sent (as MismatchError is)
  } catch (const MismatchError&) {
    throw;
  } catch (...) {
    // A failure after requests were posted: MPI may still use the memory, which the Arrays do not own here.
    if (!owned) {
      result.inc_ref();
      nb::handle(x).inc_ref();
    }
    throw;
  }
  return std::make_pair(std::move(result), std::move(t));
}

/// (result, token): numpy_call for host NumPy inputs, `value` (value_call) for anything else.
template <typename ShapeFn, typename Fill, typename Value>
nb::tuple call(const Communicator& c, nb::handle x, ShapeFn&& result_shape, Fill&& fill, Value&& value) {
  if (auto r = numpy_call(c, x, std::forward<ShapeFn>(result_shape), std::forward<Fill>(fill)))
    return nb::make_tuple(r->first, token_object(r->second));
  return value_call(x, std::forward<Value>(value));
}

/// Result shapes for call(): the input's own (reductions, scans, receives) ...
inline Shape same_shape(const Array& a) { return a.shape(); }
/// ... or `n` of them stacked (allgather).
inline Shape stacked(int n, const Shape& s) {
  Shape out{n};
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

/// What shardkit recognises of mpi4py.MPI, looked up once the module is loaded. Looking it up per call (an import and
/// a type's __module__) cost about 2 us, more than a small collective.
struct Mpi4py {
  nb::object comm_type;  ///< mpi4py.MPI.Comm (Intracomm, Cartcomm, ... derive from it)
  nb::object handleof;   ///< mpi4py.MPI._handleof
  /// mpi4py's C API function PyMPIComm_Get (from MPI.__pyx_capi__, as mpi4py's own C header imports it): the address
  /// of a Comm object's MPI_Comm, without a Python call. nullptr if this mpi4py does not export it.
  void* (*comm_get)(PyObject*) = nullptr;
  std::unordered_map<PyObject*, ReduceOp> ops;  ///< MPI.SUM, ...: Op objects are singletons, looked up by identity
  std::vector<nb::object> keep;                 ///< references to those Op objects, so their addresses stay theirs
  int any_source = kAnySource;
  int any_tag = kAnyTag;
};

/// mpi4py.MPI's objects, or nullptr while the module is not loaded (an mpi4py object implies it is). Lives as long as
/// the interpreter.
const Mpi4py* mpi4py_api();

}  // namespace shardkit::py
