#include "py_fastcall.hpp"

#include <climits>
#include <string>
#include <string_view>

#include "shardkit/core/error.hpp"

namespace shardkit::py {

int FastArgs::get_int(int i, int fallback) const {
  if (!v_[i]) return fallback;
  const long v = PyLong_AsLong(v_[i]);  // __index__ objects too; floats and strings raise TypeError
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  if (v < INT_MIN || v > INT_MAX) {
    PyErr_Format(PyExc_OverflowError, "Python int %ld does not fit in a C int", v);
    throw nb::python_error();
  }
  return static_cast<int>(v);
}

bool parse_fast_args(const FastSignature& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     FastArgs& out) {
  if (nargs > sig.positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)", sig.function,
                 sig.positional, sig.positional == 1 ? "" : "s", nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out.v_[i] = args[i];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  const auto n = static_cast<int>(sig.names.size());
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int found = -1;
    for (int i = 0; i < n && found < 0; ++i)
      if (key == sig.names[i]) found = i;  // call sites intern their keywords: one address compare
    for (int i = 0; i < n && found < 0; ++i)  // f(**kwargs) with keys made at run time
      if (PyUnicode_Check(key) && PyUnicode_Compare(key, sig.names[i]) == 0) found = i;
    if (found < 0) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%S'", sig.function, key);
      return false;
    }
    if (out.v_[found]) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", sig.function,
                   sig.name_chars[found]);
      return false;
    }
    out.v_[found] = args[nargs + k];
  }
  for (int i = 0; i < sig.required; ++i) {
    if (!out.v_[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", sig.function, sig.name_chars[i],
                   i + 1);
      return false;
    }
  }
  return true;
}

namespace detail {

FastSignature* make_fast_signature(const char* function, const char* signature) {
  auto* sig = new FastSignature();  // interpreter lifetime, like the function object using it
  sig->function = function;
  std::string_view s(signature);
  SHARDKIT_CHECK(s.size() >= 2 && s.front() == '(' && s.back() == ')', "bad signature ", signature);
  s = s.substr(1, s.size() - 2);
  bool keyword_only = false, optional_seen = false;
  while (!s.empty()) {
    const std::size_t comma = s.find(',');
    std::string_view p = s.substr(0, comma);
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
    while (!p.empty() && p.front() == ' ') p.remove_prefix(1);
    while (!p.empty() && p.back() == ' ') p.remove_suffix(1);
    if (p == "*") {
      keyword_only = true;
      continue;
    }
    const std::size_t eq = p.find('=');
    const bool has_default = eq != std::string_view::npos;
    const std::string name(p.substr(0, eq));
    SHARDKIT_CHECK(!(optional_seen && !has_default), "required parameter after an optional one in ", signature);
    optional_seen = optional_seen || has_default;
    PyObject* interned = PyUnicode_InternFromString(name.c_str());
    if (!interned) throw nb::python_error();
    sig->names.push_back(interned);
    sig->name_chars.push_back(PyUnicode_AsUTF8(interned));
    if (!keyword_only) ++sig->positional;
    if (!has_default) ++sig->required;
  }
  SHARDKIT_CHECK_LE(static_cast<int>(sig->names.size()), FastArgs::kMax, "too many parameters in ", signature);
  return sig;
}

void add_fast_function(nb::module_& m, const char* attr, const char* function, const char* signature,
                       const char* doc, PyObject* (*impl)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*)) {
  // "name(sig)\n--\n\n" opening the docstring is how CPython's built-in functions carry __text_signature__.
  auto* text = new std::string(std::string(function) + signature + "\n--\n\n" + doc);
  auto* def = new PyMethodDef{function, reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(impl)),
                              METH_FASTCALL | METH_KEYWORDS, text->c_str()};
  nb::object module_name = nb::getattr(m, "__name__");
  PyObject* f = PyCFunction_NewEx(def, m.ptr(), module_name.ptr());
  if (!f) throw nb::python_error();
  m.attr(attr) = nb::steal(f);
}

}  // namespace detail
}  // namespace shardkit::py
