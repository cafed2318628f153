// The Python caller of an operation, for the flight recorder: the innermost frame outside the shardkit package, its
// file interned once per file name (the name object is kept, so its address stays unique) and its line.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

// CPython 3.11: the interpreter's own frames are read without making frame objects (PyEval_GetFrame makes one for
// each new frame, an allocation per call from a fresh frame such as a lambda's). The layout is this version's only.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API) && !defined(SHARDKIT_NO_FRAME_PEEK)
#define SHARDKIT_PEEK_FRAMES 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE
#endif
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

#include <cstdint>
#include <string>
#include <unordered_map>

#include "py_comm.hpp"
#include "shardkit/collectives/call_site.hpp"
#include "shardkit/collectives/options.hpp"

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

// The site of one frame: (code object, instruction offset) -> file, line, and whether the file is the package's.
// Computing a line number walks the code's line table; a collective is called from few places, so a small
// direct-mapped cache (holding its code objects, so that an address is never reused under it) makes the usual case a
// lookup. Before Python 3.11 there is no instruction offset to key on: the line is computed each time.
struct CachedSite {
  PyCodeObject* code = nullptr;  // strong reference
  int lasti = -1;
  const FileInfo* file = nullptr;
  int line = 0;
};

const FileInfo& file_of(PyCodeObject* code) {
  static auto* files = new std::unordered_map<PyObject*, FileInfo>();  // under the GIL; never freed
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
  return it->second;
}

#if PY_VERSION_HEX >= 0x030B0000
// The site of `code` at byte offset `lasti` (borrowed code object; the cache keeps its own reference).
const CachedSite& site_of(PyCodeObject* code, int lasti) {
  static CachedSite cache[256];
  CachedSite& e = cache[((reinterpret_cast<std::uintptr_t>(code) >> 4) ^ (static_cast<std::uintptr_t>(lasti) *
                                                                           2654435761u)) & 255];
  if (e.code == code && e.lasti == lasti) return e;
  Py_INCREF(code);
  Py_XDECREF(e.code);
  e = {code, lasti, &file_of(code), PyCode_Addr2Line(code, lasti)};
  return e;
}
#endif

#if !SHARDKIT_PEEK_FRAMES
const CachedSite& site_of(PyFrameObject* f, PyCodeObject* code) {
#if PY_VERSION_HEX >= 0x030B0000
  return site_of(code, PyFrame_GetLasti(f));
#else
  static CachedSite e;
  e = {nullptr, -1, &file_of(code), PyFrame_GetLineNumber(f)};
  return e;
#endif
}
#endif

}  // namespace

void note_call_site() {
  // SHARDKIT_TRACE_BUFFER=0 without SHARDKIT_TRACE: nothing to pay for
  static const bool recording =
      CommOptions::defaults().trace_buffer > 0 || !ProcessSettings::current().trace_dir.empty();
  if (!recording) return;
  CallSite& site = current_call_site();
  site = {};
#if SHARDKIT_PEEK_FRAMES
  int depth = 0;
  for (_PyInterpreterFrame* f = PyThreadState_Get()->cframe->current_frame; f && depth < 8; f = f->previous) {
    if (_PyFrame_IsIncomplete(f)) continue;  // as PyEval_GetFrame skips them
    ++depth;
    const CachedSite& c = site_of(f->f_code, _PyInterpreterFrame_LASTI(f) * static_cast<int>(sizeof(_Py_CODEUNIT)));
    if (!c.file->internal) {
      site = {c.file->name.c_str(), c.line};
      return;
    }
  }
#else
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  for (int depth = 0; f && depth < 8; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);
    const CachedSite& c = site_of(f, code);
    Py_DECREF(code);
    if (!c.file->internal) {
      site = {c.file->name.c_str(), c.line};
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
#endif
}

}  // namespace shardkit::py
