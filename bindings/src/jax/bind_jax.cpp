// The JAX layer's C++ side: a registry of communicators named by integer handles in compiled programs, the facts of
// the operation table Python needs to trace an operation (its code, value shape, reduction), the XLA FFI targets as
// capsules for jax.ffi.register_ffi_target, and the hook through which shardkit.mpi hands JAX values to shardkit._jax.

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <string>
#include <vector>

#include "../py_array.hpp"
#include "../py_comm.hpp"
#include "jax_layer.hpp"

namespace shardkit::py {

#ifdef SHARDKIT_HAVE_JAX_FFI
// ffi_handlers.cpp: the handlers' C entry points (XLA_FFI_Handler*) by target name.
std::vector<std::pair<std::string, void*>> jax_ffi_handlers();
#endif

namespace {

std::mutex g_registry_mutex;
// Per communicator handed to the JAX layer: the communicator and the duplicate compiled programs run on. Entries are
// added once and kept (a compiled program may hold a handle) until shutdown.
struct Registered {
  CommPtr original;
  CommPtr jax;
};
std::vector<Registered>& registry() {
  static auto* r = new std::vector<Registered>();
  return *r;
}

// Compiled programs run on XLA's threads, asynchronously to the Python thread: their operations get a duplicate of the
// communicator (its own message space), so they never match an eager operation issued meanwhile. Collective the first
// time (every rank traces the same program, so every rank registers the same communicators in the same order).
std::int64_t register_comm(const CommPtr& c) {
  {
    std::lock_guard lock(g_registry_mutex);
    auto& r = registry();
    for (std::size_t i = 0; i < r.size(); ++i)
      if (r[i].original.get() == c.get()) return static_cast<std::int64_t>(i);
  }
  CommPtr dup;
  {
    nb::gil_scoped_release release;
    dup = c->dup(c->name() + " (jax)");
  }
  std::lock_guard lock(g_registry_mutex);
  registry().push_back({c, std::move(dup)});
  return static_cast<std::int64_t>(registry().size() - 1);
}

// The Python JAX layer: its dispatch function and the types that mark a JAX value.
struct Hook {
  PyObject* fn = nullptr;
  PyTypeObject* array_type = nullptr;   // jaxlib's ArrayImpl
  PyTypeObject* tracer_type = nullptr;  // jax.core.Tracer (every tracer derives from it)
  PyTypeObject* token_type = nullptr;   // jax.core.Token
  bool tried = false;                   // shardkit._jax was imported (or failed to be)
};
Hook g_hook;

bool is_jax_value(nb::handle h) {
  PyTypeObject* t = Py_TYPE(h.ptr());
  return t == g_hook.array_type || t == g_hook.token_type ||
         (g_hook.tracer_type && PyType_IsSubtype(t, g_hook.tracer_type));
}

// Loads shardkit._jax (which installs the hook) once JAX itself is loaded: JAX stays optional and is never imported by
// shardkit on its own.
bool hook_ready() {
  if (g_hook.fn) return true;
  if (g_hook.tried) return false;
  PyObject* mods = PyImport_GetModuleDict();
  if (!PyDict_GetItemString(mods, "jax")) return false;
  g_hook.tried = true;
  nb::module_::import_("shardkit._jax");
  return g_hook.fn != nullptr;
}

}  // namespace

Communicator& jax_comm(std::int64_t handle) {
  std::lock_guard lock(g_registry_mutex);
  auto& r = registry();
  SHARDKIT_CHECK(handle >= 0 && handle < static_cast<std::int64_t>(r.size()), "unknown communicator handle ", handle,
                 " (communicators are released at shutdown)");
  return *r[static_cast<std::size_t>(handle)].jax;
}

void clear_jax_comms() {
  std::vector<Registered> drop;
  {
    std::lock_guard lock(g_registry_mutex);
    drop.swap(registry());
  }
}

bool jax_dispatch(OpKind op, const FastArgs& a, nb::handle comm, nb::object* out) {
  nb::handle x = a.get(op == OpKind::kSendrecv ? Field::kSendbuf : Field::kX);
  nb::handle token = a.get(Field::kToken);
  // The NumPy hot path: an ndarray with no token pays three comparisons.
  if (token.is_none() && op != OpKind::kBarrier && is_ndarray(x)) return false;
  if (!hook_ready()) return false;
  const bool jax_input = is_jax_value(x) || is_jax_value(token) ||
                         (op == OpKind::kSendrecv && is_jax_value(a.get(Field::kRecvbuf)));
  if (!jax_input && op != OpKind::kBarrier) return false;  // barrier asks the hook whether JAX is tracing
  nb::dict kwargs;
  for (Field f : {Field::kX, Field::kSendbuf, Field::kRecvbuf, Field::kOp, Field::kRoot, Field::kSource, Field::kDest,
                  Field::kTag, Field::kSendtag, Field::kRecvtag, Field::kStatus, Field::kToken}) {
    nb::handle v = a.get(f, nb::handle());
    if (v.ptr()) kwargs[field_name(f)] = v;
  }
  nb::object r = nb::borrow(g_hook.fn)(op_name(op), kwargs, comm);
  if (r.ptr() == Py_NotImplemented) return false;
  *out = std::move(r);
  return true;
}

bool jax_tracer(nb::handle x) {
  if (is_ndarray(x) || !hook_ready()) return false;
  return g_hook.tracer_type && PyType_IsSubtype(Py_TYPE(x.ptr()), g_hook.tracer_type);
}

void register_jax(nb::module_& m) {
  m.def("_jax_comm_handle", [](nb::handle comm) { return register_comm(comm_from(comm)); }, nb::arg("comm").none(),
        "The integer handle compiled programs use for a communicator: a duplicate made at the first registration "
        "(collective), kept until shutdown.");
  m.def("_jax_comm_info", [](std::int64_t h) {
    Communicator& c = jax_comm(h);
    return nb::make_tuple(c.rank(), c.size());
  }, "(rank, size) of a registered communicator.");
  m.def("_jax_comm_sequence", [](std::int64_t h) { return jax_comm(h).sequence(); },
        "Operations issued so far on a registered communicator's duplicate (what compiled programs ran).");
  m.def("_op_code", [](const std::string& name) {
    for (int i = 0; i < kOpCount; ++i)
      if (name == op_name(static_cast<OpKind>(i))) return i;
    throw InvalidArgument("unknown operation '" + name + "'");
  }, "The operation table's index of an operation name.");
  m.def("_reduce_code", [](nb::handle op) { return static_cast<int>(reduce_op_of(op)); },
        "A reduction from Python (mpi4py op, name, ReduceOp) as its integer code.");
  m.def("_reduce_supports", [](int op, const std::string& dtype) {
    return reduce_op_supports(static_cast<ReduceOp>(op), dtype_from_name(dtype));
  });
  m.def("_value_shape", [](const std::string& name, std::vector<std::int64_t> shape, int rank, int size, int root) {
    for (int i = 0; i < kOpCount; ++i)
      if (name == op_name(static_cast<OpKind>(i))) return value_shape(static_cast<OpKind>(i), shape, rank, size, root);
    throw InvalidArgument("unknown operation '" + name + "'");
  }, "The value form's result shape (the operation table's rule), raising InvalidArgument where the rule does.");
  m.def("_set_jax_hook", [m](nb::object fn, nb::object array_type, nb::object tracer_type, nb::object token_type) {
    // The module holds the references (released with it at shutdown); the hook borrows them.
    m.attr("_jax_hook_refs") = nb::make_tuple(fn, array_type, tracer_type, token_type);
    g_hook.fn = fn.ptr();
    g_hook.array_type = reinterpret_cast<PyTypeObject*>(array_type.ptr());
    g_hook.tracer_type = reinterpret_cast<PyTypeObject*>(tracer_type.ptr());
    g_hook.token_type = reinterpret_cast<PyTypeObject*>(token_type.ptr());
    g_hook.tried = true;
  });
  m.def("_jax_ffi_targets", [] {
    nb::dict d;
#ifdef SHARDKIT_HAVE_JAX_FFI
    for (auto& [name, fn] : jax_ffi_handlers()) d[name.c_str()] = nb::steal(PyCapsule_New(fn, nullptr, nullptr));
#endif
    return d;
  }, "The XLA FFI handlers built into this extension, by target name (empty when built without jaxlib's headers).");
}

}  // namespace shardkit::py
