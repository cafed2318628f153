// C++ errors become Python exceptions of the shardkit hierarchy:
//   shardkit.Error(RuntimeError)
//   ├── InvalidArgument(Error, ValueError)
//   ├── MismatchError(Error)
//   ├── TimeoutError(Error, builtins.TimeoutError)
//   └── BackendError(Error)            .backend ("MPI", "NCCL", "CUDA", ...) and .native_code
// No C++ exception crosses into Python untranslated.

#include <nanobind/nanobind.h>

#include "py_fastcall.hpp"
#include "shardkit/core/error.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {
PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_mismatch = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_backend = nullptr;

// shardkit's errors as the Python exceptions of the hierarchy above (registered with nanobind).
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    PyErr_SetString(g_invalid, e.what());
  } catch (const MismatchError& e) {
    PyErr_SetString(g_mismatch, e.what());
  } catch (const TimeoutError& e) {
    PyErr_SetString(g_timeout, e.what());
  } catch (const BackendError& e) {
    PyObject* args = Py_BuildValue("(s)", e.what());
    PyObject* exc = PyObject_Call(g_backend, args, nullptr);
    Py_XDECREF(args);
    if (exc) {
      PyObject_SetAttrString(exc, "backend", nb::str(e.backend().c_str()).ptr());
      PyObject_SetAttrString(exc, "native_code", nb::int_(e.native_code()).ptr());
      PyErr_SetObject(g_backend, exc);
      Py_DECREF(exc);
    }
  } catch (const Error& e) {
    PyErr_SetString(g_error, e.what());
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
  g_invalid = make_type(m, "InvalidArgument", nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError)).release().ptr(),
                        "A caller passed something the API does not accept; nothing was sent.");
  g_mismatch = make_type(m, "MismatchError", g_error, "Ranks disagreed on a collective (checked mode).");
  g_timeout = make_type(m, "TimeoutError", nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_TimeoutError)).release().ptr(),
                        "An operation did not complete within SHARDKIT_TIMEOUT_S; its communicator is aborted.");
  g_backend = make_type(m, "BackendError", g_error, "MPI, NCCL, CUDA or BLAS reported a failure (see .backend, .native_code).");

  nb::register_exception_translator(translate);
}

void set_python_error_from_exception() noexcept {
  try {
    throw;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const nb::builtin_exception& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.type()) {
      case nb::exception_type::stop_iteration: type = PyExc_StopIteration; break;
      case nb::exception_type::index_error: type = PyExc_IndexError; break;
      case nb::exception_type::key_error: type = PyExc_KeyError; break;
      case nb::exception_type::value_error: type = PyExc_ValueError; break;
      case nb::exception_type::type_error: type = PyExc_TypeError; break;
      case nb::exception_type::buffer_error: type = PyExc_BufferError; break;
      case nb::exception_type::import_error: type = PyExc_ImportError; break;
      case nb::exception_type::attribute_error: type = PyExc_AttributeError; break;
      default: break;
    }
    PyErr_SetString(type, e.what());
  } catch (const Error&) {
    translate(std::current_exception(), nullptr);
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
