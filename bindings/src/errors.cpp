// C++ errors become Python exceptions of the shardkit hierarchy:
//   shardkit.Error(RuntimeError)
//   ├── InvalidArgument(Error, ValueError)
//   ├── MismatchError(Error)
//   ├── TimeoutError(Error, builtins.TimeoutError)
//   └── BackendError(Error)            .backend ("MPI", "NCCL", "CUDA", ...) and .native_code
// No C++ exception crosses into Python untranslated.

#include <nanobind/nanobind.h>

#include "shardkit/core/error.hpp"

namespace shardkit::py {

namespace nb = nanobind;

namespace {
PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_mismatch = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_backend = nullptr;

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

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
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
  });
}

}  // namespace shardkit::py
