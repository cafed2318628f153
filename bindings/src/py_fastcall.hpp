#pragma once

// Module functions called through CPython's vectorcall protocol directly, for the per-call hot paths (shardkit.mpi,
// psum/pmax/pmin). nanobind's general dispatcher (keyword matching, two overload passes, a cleanup list) cost 742
// instructions a call of allreduce(x, op=...) (callgrind), this parser about 100: at small sizes that is 0.1 us, the
// margin by which a call was slower than mpi4py's. The functions take Python objects and convert them themselves;
// their C++ exceptions become the same Python exceptions as from nanobind-bound functions.

#include <nanobind/nanobind.h>

#include <array>
#include <vector>

namespace shardkit::py {

namespace nb = nanobind;

/// A parsed text signature such as "(x, op, *, comm=None, token=None)": parameters before "*" may be passed by
/// position, parameters without a default are required.
struct FastSignature {
  const char* function = "";
  std::vector<PyObject*> names;  // interned, so that keywords from call sites compare by address
  std::vector<const char*> name_chars;
  int positional = 0;
  int required = 0;
};

/// The arguments of one call, in signature order; a missing optional argument is nullptr.
class FastArgs {
 public:
  static constexpr int kMax = 10;

  /// The argument, or `fallback` (None by default) when it was not passed.
  nb::handle get(int i, nb::handle fallback = Py_None) const { return v_[i] ? nb::handle(v_[i]) : fallback; }
  /// The argument as a C int (anything with __index__), or `fallback` when it was not passed.
  /// @throws nb::python_error (TypeError, OverflowError) as Python's own int conversion.
  int get_int(int i, int fallback = 0) const;

 private:
  friend bool parse_fast_args(const FastSignature&, PyObject* const*, Py_ssize_t, PyObject*, FastArgs&);
  std::array<PyObject*, kMax> v_{};
};

/// Fills `out` from a vectorcall's arguments; on a bad call sets Python's TypeError (as Python's own functions word
/// it) and returns false.
bool parse_fast_args(const FastSignature& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     FastArgs& out);

/// Sets the Python error for the C++ exception being handled (call inside a catch block), as nanobind does for its
/// functions: shardkit's errors as shardkit.InvalidArgument, ...; Python errors restored; nanobind's and the
/// standard library's as the matching built-in exceptions.
void set_python_error_from_exception() noexcept;

namespace detail {

FastSignature* make_fast_signature(const char* function, const char* signature);
void add_fast_function(nb::module_& m, const char* attr, const char* function, const char* signature,
                       const char* doc, PyObject* (*impl)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*));

template <nb::object (*Fn)(const FastArgs&)>
inline FastSignature* fast_signature = nullptr;

template <nb::object (*Fn)(const FastArgs&)>
PyObject* fast_trampoline(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  FastArgs a;
  if (!parse_fast_args(*fast_signature<Fn>, args, nargs, kwnames, a)) return nullptr;
  try {
    return Fn(a).release().ptr();
  } catch (...) {
    set_python_error_from_exception();
    return nullptr;
  }
}

}  // namespace detail

/// Defines module attribute `attr` as the function `Fn`, named `function` with text signature `signature` (shown by
/// help() and inspect.signature) and docstring `doc`.
template <nb::object (*Fn)(const FastArgs&)>
void def_fast(nb::module_& m, const char* attr, const char* function, const char* signature, const char* doc) {
  detail::fast_signature<Fn> = detail::make_fast_signature(function, signature);
  detail::add_fast_function(m, attr, function, signature, doc, &detail::fast_trampoline<Fn>);
}

}  // namespace shardkit::py
