#pragma once

// Functions and methods called through CPython's vectorcall protocol directly, for the per-call hot paths
// (shardkit.mpi, Communicator operations, psum/pmax/pmin): nanobind's general dispatcher (keyword matching, overload
// passes, a cleanup list) costs more than a small collective. A function is declared once, as a list of parameters;
// the parser's table and the text signature that help() and inspect.signature show are both made from that list, and
// the function reads its arguments by field, never by position. C++ exceptions become the same Python exceptions as
// from nanobind-bound functions (errors.cpp's table).

#include <nanobind/nanobind.h>

#include <array>
#include <initializer_list>
#include <vector>

namespace shardkit::py {

namespace nb = nanobind;

/// Every argument a fast function can take; a parameter's Python name is its field's.
enum class Field : std::uint8_t {
  kX,
  kSendbuf,
  kRecvbuf,
  kOp,
  kRoot,
  kSource,
  kDest,
  kTag,
  kSendtag,
  kRecvtag,
  kComm,
  kStatus,
  kToken,
  kAxisName,
  kAxisIndexGroups,
};
inline constexpr int kFieldCount = static_cast<int>(Field::kAxisIndexGroups) + 1;
/// "x", "sendbuf", ..., "axis_index_groups".
const char* field_name(Field f) noexcept;

/// One parameter: a field, its default as Python source ("None", "0", "ANY_TAG"; nullptr: required), and whether it
/// may only be passed by keyword.
struct Param {
  Field field;
  const char* default_text = nullptr;
  bool keyword_only = false;
};

/// A required positional parameter, an optional positional one, an optional keyword-only one.
constexpr Param arg(Field f) { return {f, nullptr, false}; }
constexpr Param opt(Field f, const char* default_text) { return {f, default_text, false}; }
constexpr Param kw(Field f, const char* default_text) { return {f, default_text, true}; }

/// The parser's view of a parameter list: names interned (so keywords from call sites compare by address), the number
/// of positional and of required parameters.
struct FastSignature {
  std::string function;
  std::vector<Field> fields;
  std::vector<PyObject*> names;
  int positional = 0;
  int required = 0;
  /// "(x, op, *, comm=None, token=None)".
  std::string text;
};

/// Builds the signature of `function` from `params` (positional first, keyword-only after; required before optional).
FastSignature* make_fast_signature(const char* function, const std::vector<Param>& params);

/// The arguments of one call by field; a missing optional argument is nullptr.
class FastArgs {
 public:
  /// The argument, or `fallback` (None by default) when it was not passed.
  nb::handle get(Field f, nb::handle fallback = Py_None) const {
    PyObject* v = v_[static_cast<int>(f)];
    return v ? nb::handle(v) : fallback;
  }
  /// The argument as a C int (anything with __index__), or `fallback` when it was not passed.
  /// @throws nb::python_error (TypeError, OverflowError) as Python's own int conversion.
  int get_int(Field f, int fallback = 0) const;
  /// The object a method was called on (nullptr for module functions).
  PyObject* self = nullptr;

 private:
  friend bool parse_fast_args(const FastSignature&, PyObject* const*, Py_ssize_t, PyObject*, FastArgs&);
  std::array<PyObject*, kFieldCount> v_{};
};

/// Fills `out` from a vectorcall's arguments; on a bad call sets Python's TypeError (as Python's own functions word
/// it) and returns false.
bool parse_fast_args(const FastSignature& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     FastArgs& out);

/// Sets the Python error for the C++ exception being handled (call inside a catch block): errors.cpp's one table.
void set_python_error_from_exception() noexcept;

using FastFn = nb::object (*)(const FastArgs&);

namespace detail {

using VectorcallImpl = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

template <FastFn Fn>
inline FastSignature* fast_signature = nullptr;

template <FastFn Fn>
PyObject* fast_trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  FastArgs a;
  a.self = self;
  if (!parse_fast_args(*fast_signature<Fn>, args, nargs, kwnames, a)) return nullptr;
  try {
    return Fn(a).release().ptr();
  } catch (...) {
    set_python_error_from_exception();
    return nullptr;
  }
}

/// The PyMethodDef of a fast function (interpreter lifetime), its docstring opening with the text signature.
PyMethodDef* make_method_def(const FastSignature& sig, const char* doc, VectorcallImpl impl);
void add_function(nb::handle module, const char* attr, PyMethodDef* def);
void add_method(nb::handle type, PyMethodDef* def);

}  // namespace detail

/// Defines module attribute `attr` as the function `Fn` named `function`, taking `params`.
template <FastFn Fn>
void def_fast(nb::module_& m, const char* attr, const char* function, const std::vector<Param>& params,
              const char* doc) {
  detail::fast_signature<Fn> = make_fast_signature(function, params);
  detail::add_function(m, attr, detail::make_method_def(*detail::fast_signature<Fn>, doc, &detail::fast_trampoline<Fn>));
}

/// Defines method `name` of the nanobind class `type` as `Fn` (which finds the object in FastArgs::self).
template <FastFn Fn>
void def_fast_method(nb::handle type, const char* name, const std::vector<Param>& params, const char* doc) {
  detail::fast_signature<Fn> = make_fast_signature(name, params);
  detail::add_method(type, detail::make_method_def(*detail::fast_signature<Fn>, doc, &detail::fast_trampoline<Fn>));
}

}  // namespace shardkit::py
