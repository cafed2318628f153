#include "py_fastcall.hpp"

#include <climits>
#include <string>

#include "shardkit/core/error.hpp"

namespace shardkit::py {

const char* field_name(Field f) noexcept {
  switch (f) {
    case Field::kX: return "x";
    case Field::kSendbuf: return "sendbuf";
    case Field::kRecvbuf: return "recvbuf";
    case Field::kOp: return "op";
    case Field::kRoot: return "root";
    case Field::kSource: return "source";
    case Field::kDest: return "dest";
    case Field::kTag: return "tag";
    case Field::kSendtag: return "sendtag";
    case Field::kRecvtag: return "recvtag";
    case Field::kComm: return "comm";
    case Field::kStatus: return "status";
    case Field::kToken: return "token";
    case Field::kAxisName: return "axis_name";
    case Field::kAxisIndexGroups: break;
  }
  return "axis_index_groups";
}

FastSignature* make_fast_signature(const char* function, const std::vector<Param>& params) {
  auto* sig = new FastSignature();  // interpreter lifetime, like the function object using it
  sig->function = function;
  bool keyword_only = false, optional_seen = false;
  sig->text = "(";
  for (const Param& p : params) {
    SHARDKIT_CHECK(!(keyword_only && !p.keyword_only), function, ": a positional parameter after a keyword-only one");
    SHARDKIT_CHECK(!(optional_seen && !p.default_text && !p.keyword_only), function,
                   ": a required parameter after an optional one");
    if (sig->text.size() > 1) sig->text += ", ";
    if (p.keyword_only && !keyword_only) sig->text += "*, ";
    keyword_only = keyword_only || p.keyword_only;
    optional_seen = optional_seen || p.default_text;
    sig->text += field_name(p.field);
    if (p.default_text) sig->text += std::string("=") + p.default_text;
    PyObject* interned = PyUnicode_InternFromString(field_name(p.field));
    if (!interned) throw nb::python_error();
    sig->fields.push_back(p.field);
    sig->names.push_back(interned);
    if (!p.keyword_only) ++sig->positional;
    if (!p.default_text) ++sig->required;
  }
  sig->text += ")";
  return sig;
}

int FastArgs::get_int(Field f, int fallback) const {
  PyObject* v = v_[static_cast<int>(f)];
  if (!v) return fallback;
  const long n = PyLong_AsLong(v);  // __index__ objects too; floats and strings raise TypeError
  if (n == -1 && PyErr_Occurred()) throw nb::python_error();
  if (n < INT_MIN || n > INT_MAX) {
    PyErr_Format(PyExc_OverflowError, "Python int %ld does not fit in a C int", n);
    throw nb::python_error();
  }
  return static_cast<int>(n);
}

bool parse_fast_args(const FastSignature& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     FastArgs& out) {
  const char* fn = sig.function.c_str();
  if (nargs > sig.positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)", fn, sig.positional,
                 sig.positional == 1 ? "" : "s", nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out.v_[static_cast<int>(sig.fields[i])] = args[i];
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
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%S'", fn, key);
      return false;
    }
    PyObject*& slot = out.v_[static_cast<int>(sig.fields[found])];
    if (slot) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn, field_name(sig.fields[found]));
      return false;
    }
    slot = args[nargs + k];
  }
  for (int i = 0; i < sig.required; ++i) {
    if (!out.v_[static_cast<int>(sig.fields[i])]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", fn, field_name(sig.fields[i]),
                   i + 1);
      return false;
    }
  }
  return true;
}

namespace detail {

PyMethodDef* make_method_def(const FastSignature& sig, const char* doc, VectorcallImpl impl) {
  // "name(sig)\n--\n\n" opening the docstring is how CPython's built-in functions carry __text_signature__; methods
  // name their object "$self".
  auto* text = new std::string(sig.function + sig.text + "\n--\n\n" + doc);
  return new PyMethodDef{sig.function.c_str(), reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(impl)),
                         METH_FASTCALL | METH_KEYWORDS, text->c_str()};
}

void add_function(nb::handle module, const char* attr, PyMethodDef* def) {
  nb::object module_name = nb::getattr(module, "__name__");
  PyObject* f = PyCFunction_NewEx(def, module.ptr(), module_name.ptr());
  if (!f) throw nb::python_error();
  nb::setattr(module, attr, nb::steal(f));
}

void add_method(nb::handle type, PyMethodDef* def) {
  std::string doc = def->ml_doc;
  const std::size_t open = doc.find('(');
  doc.insert(open + 1, doc[open + 1] == ')' ? "$self" : "$self, ");
  def->ml_doc = (new std::string(std::move(doc)))->c_str();
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(type.ptr()), def);
  if (!descr) throw nb::python_error();
  nb::setattr(type, def->ml_name, nb::steal(descr));
}

}  // namespace detail
}  // namespace shardkit::py
