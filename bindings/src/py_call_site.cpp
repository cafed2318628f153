// The Python caller of an operation, for the flight recorder: the innermost frame outside the shardkit package, its
// file interned once per file name (the name object is kept, so its address stays unique) and its line.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <unordered_map>

#include "py_comm.hpp"
#include "shardkit/collectives/call_site.hpp"
#include "shardkit/launch/config.hpp"

namespace shardkit::py {

namespace {
struct FileInfo {
  std::string name;
  bool internal;  // a file of the shardkit package: look further out
};
// The shardkit package's directory with a trailing slash (its own frames are skipped).
const std::string& package_dir() {
  static const std::string dir = [] {
    std::string d = nb::cast<std::string>(nb::module_::import_("shardkit").attr("__path__")[0]);
    return d + "/";
  }();
  return dir;
}
}  // namespace

void note_call_site() {
  // SHARDKIT_TRACE_BUFFER=0 without SHARDKIT_TRACE: nothing to pay for
  static const bool recording = Config::get().trace_buffer > 0 || !Config::get().trace_dir.empty();
  if (!recording) return;
  static auto* files = new std::unordered_map<PyObject*, FileInfo>();  // under the GIL; never freed
  CallSite& site = current_call_site();
  site = {};
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  for (int depth = 0; f && depth < 8; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);
    PyObject* name = code->co_filename;
    auto it = files->find(name);
    if (it == files->end()) {
      Py_INCREF(name);
      const char* utf8 = PyUnicode_AsUTF8(name);
      std::string s = utf8 ? utf8 : "?";
      const bool internal = s.rfind(package_dir(), 0) == 0;
      if (!utf8) PyErr_Clear();
      it = files->emplace(name, FileInfo{std::move(s), internal}).first;
    }
    Py_DECREF(code);
    if (!it->second.internal) {
      site = {it->second.name.c_str(), PyFrame_GetLineNumber(f)};
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
}

}  // namespace shardkit::py
