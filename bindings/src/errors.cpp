// C++ errors become Python exceptions of the shardkit hierarchy:
//   shardkit.Error(RuntimeError)
//   ├── InvalidArgument(Error, ValueError)
//   ├── MismatchError(Error)
//   ├── TimeoutError(Error, builtins.TimeoutError)
//   ├── BackendError(Error)            .backend ("MPI", "NCCL", "CUDA", ...) and .native_code
//   ├── InternalError(Error)
//   └── Interrupted(Error, KeyboardInterrupt)
// one class per row of core's error table (error_kind()), with its name, docstring and built-in base.
// Every one has .where: the check or native call that raised it and its source file:line (None when not a check).
// One translation (set_python_error_from_exception) serves nanobind-bound and fast-call functions alike; no C++
// exception crosses into Python untranslated.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "py_fastcall.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {

// The Python type of each shardkit error code (filled by register_errors).
PyObject* g_types[kErrorCodeCount] = {};
PyObject* g_error = nullptr;

PyObject* type_of(ErrorCode code) {
  PyObject* t = g_types[static_cast<int>(code)];
  return t ? t : g_error;
}

// A wait ended by SIGINT: Python's own handler, chained to by shardkit's, has a KeyboardInterrupt (or whatever the
// program's handler raises) pending too. Running it now keeps it from firing again later, in the caller's except
// block: a plain KeyboardInterrupt gives way to the Interrupted error naming the operation, anything else stands.
bool raised_by_python_handler() {
  if (PyErr_CheckSignals() == 0) return false;
  if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) return true;
  PyErr_Clear();
  return false;
}

void set_shardkit_error(const Error& e) {
  if (e.code() == ErrorCode::kInterrupted && raised_by_python_handler()) return;
  PyObject* type = type_of(e.code());
  PyObject* exc = PyObject_CallFunction(type, "s", e.what());
  if (!exc) return;  // the error of the call is set instead
  // The message is for users; the check or native call and its source location are kept apart, for bug reports.
  PyObject_SetAttrString(exc, "where", e.where().empty() ? Py_None : nb::str(e.where().c_str()).ptr());
  if (const auto* backend = dynamic_cast<const BackendError*>(&e)) {
    PyObject_SetAttrString(exc, "backend", nb::str(backend->backend().c_str()).ptr());
    PyObject_SetAttrString(exc, "native_code", nb::int_(backend->native_code()).ptr());
  }
  PyErr_SetObject(type, exc);
  Py_DECREF(exc);
}

PyObject* builtin_type(nb::exception_type t) {
  switch (t) {
    case nb::exception_type::stop_iteration: return PyExc_StopIteration;
    case nb::exception_type::index_error: return PyExc_IndexError;
    case nb::exception_type::key_error: return PyExc_KeyError;
    case nb::exception_type::value_error: return PyExc_ValueError;
    case nb::exception_type::type_error: return PyExc_TypeError;
    case nb::exception_type::buffer_error: return PyExc_BufferError;
    case nb::exception_type::import_error: return PyExc_ImportError;
    case nb::exception_type::attribute_error: return PyExc_AttributeError;
    default: break;
  }
  return PyExc_RuntimeError;
}

// nanobind's translator hook: every C++ exception from a nanobind-bound function comes here first.
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (...) {
    set_python_error_from_exception();
  }
}

PyObject* make_type(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string full = std::string("shardkit.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::handle(t);
  return t;
}

}  // namespace

void register_errors(nb::module_& m) {
  g_error = make_type(m, "Error", PyExc_RuntimeError, "Base of every shardkit error.");
  nb::module_ builtins = nb::module_::import_("builtins");
  for (int i = 0; i < kErrorCodeCount; ++i) {  // one class per row of core's error table
    const ErrorKind& k = error_kind(static_cast<ErrorCode>(i));
    nb::object bases = k.builtin_base ? nb::object(nb::make_tuple(nb::handle(g_error), builtins.attr(k.builtin_base)))
                                      : nb::borrow(g_error);
    g_types[static_cast<int>(k.code)] = make_type(m, k.name, bases.ptr(), k.doc);
  }
  m.def(
      "_error_classes",
      [] {
        nb::dict classes;
        for (int i = 0; i < kErrorCodeCount; ++i)
          classes[error_code_name(static_cast<ErrorCode>(i))] = nb::handle(g_types[i]);
        return classes;
      },
      "{name: class} for every shardkit error code, in the order of core's error table.");
  m.def(
      "_raise_error",
      [](int code, const std::string& message) {
        SHARDKIT_CHECK(code >= 0 && code < kErrorCodeCount, "no error code ", code);
        throw Error(static_cast<ErrorCode>(code), message);
      },
      nb::arg("code"), nb::arg("message"), "Raises the shardkit error of an ErrorCode value (tests the translation).");
  nb::register_exception_translator(translate);
}

void set_python_error_from_exception() noexcept {
  try {
    throw;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const nb::builtin_exception& e) {
    PyErr_SetString(builtin_type(e.type()), e.what());
  } catch (const Error& e) {
    set_shardkit_error(e);
  } catch (const nb::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "an argument has the wrong type");
  } catch (const std::bad_alloc& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_SystemError, "an unknown C++ exception");
  }
}

}  // namespace shardkit::py
