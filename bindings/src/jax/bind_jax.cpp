// The JAX layer's C++ side: a registry of communicators named by integer handles in compiled programs, the facts of
// the operation table Python needs to trace an operation (its code, value shape, reduction), the XLA FFI targets as
// capsules for jax.ffi.register_ffi_target, and the hook through which shardkit.mpi hands JAX values to the Python JAX
// layer (shardkit.jax._ops).

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "../py_array.hpp"
#include "../py_comm.hpp"
#include "jax_layer.hpp"
#include "shardkit/collectives/call_site.hpp"
#include "shardkit/collectives/launch_fence.hpp"

namespace shardkit::py {

#ifdef SHARDKIT_HAVE_JAX_FFI
// ffi_handlers.cpp: the handlers' C entry points (XLA_FFI_Handler*) by target name.
std::vector<std::pair<std::string, void*>> jax_ffi_handlers();
#endif

namespace {

std::mutex g_registry_mutex;
// Counts the registry's clearings (at shutdown): a communicator remembered from before is gone.
std::atomic<std::uint64_t> g_registry_generation{1};
// Per communicator handed to the JAX layer: the communicator and those compiled programs run on: its duplicate, and
// for point-to-point operations on a communicator shardkit does not own (an mpi4py one, wrap_mpi) a second wrapping of
// it, made without any other rank (a send between two ranks must not wait for the others; mpi4jax runs on the caller's
// communicator itself). Once made, a program's point-to-point operations stay on the one they started on. Entries are
// added once and kept (a compiled program may hold a handle) until shutdown.
struct Registered {
  CommPtr original;
  CommPtr jax;  // collectives' (and point-to-point's, where p2p is null): a duplicate
  CommPtr p2p;  // point-to-point's on a caller's communicator
};
std::vector<Registered>& registry() {
  static auto* r = new std::vector<Registered>();
  return *r;
}

}  // namespace

// Compiled programs run on XLA's threads, asynchronously to the Python thread: their operations get a duplicate of the
// communicator (its own message space), so they never match an eager operation issued meanwhile. Collective the first
// time (every rank traces the same program, so every rank registers the same communicators in the same order); the
// default communicator's is made with it (bind_collectives.cpp, at import), so that a compiled point-to-point exchange
// needs only the ranks it names. On a caller's communicator point-to-point operations take a second wrapping of it
// instead (Registered): made by the two ranks alone, where a duplicate would need all.
std::int64_t register_comm(const CommPtr& c, OpKind op) {
  const bool p2p = !op_traits(op).collective && c->wraps_caller();
  // One registration at a time, found and made and inserted under one lock (two threads registering one communicator
  // would each make a duplicate, collectively, and the second replace the first under compiled programs' feet): taken
  // without the GIL, which a registration that makes one releases.
  nb::gil_scoped_release no_gil;
  static std::mutex registering;
  const std::lock_guard one_at_a_time(registering);
  {
    std::lock_guard lock(g_registry_mutex);
    auto& r = registry();
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (r[i].original.get() != c.get()) continue;
      if (p2p || r[i].jax) return static_cast<std::int64_t>(i);
      if (r[i].p2p && !p2p) break;  // registered by point-to-point only: its duplicate now, collectively
    }
  }
  CommPtr made =
      p2p ? Communicator::wrap_mpi(c->mpi_handle(), {.name = c->name() + " (jax)"}) : c->dup(c->name() + " (jax)");
  std::lock_guard lock(g_registry_mutex);
  auto& r = registry();
  for (std::size_t i = 0; i < r.size(); ++i)
    if (r[i].original.get() == c.get()) {
      (p2p ? r[i].p2p : r[i].jax) = std::move(made);
      g_registry_generation.fetch_add(1, std::memory_order_release);  // cached answers for this handle change
      return static_cast<std::int64_t>(i);
    }
  r.push_back(p2p ? Registered{c, nullptr, std::move(made)} : Registered{c, std::move(made), nullptr});
  return static_cast<std::int64_t>(r.size() - 1);
}

namespace {

// The Python JAX layer: its dispatch function and the types that mark a JAX value.
struct Hook {
  PyObject* fn = nullptr;
  PyTypeObject* array_type = nullptr;   // jaxlib's ArrayImpl
  PyTypeObject* tracer_type = nullptr;  // jax.core.Tracer (every tracer derives from it)
  PyTypeObject* token_type = nullptr;   // jax.core.Token
  // Whether JAX is tracing: where jax.core keeps the current trace and axis environment (an object and the name of
  // its attribute, as shardkit.jax._compat.trace_probe finds them for the installed JAX) and their values at the top
  // level (no trace), compared by identity as jax.core.trace_state_clean does; or, where JAX's internals differ, that
  // function itself (`clean`).
  PyObject* trace_state = nullptr;
  PyObject* trace_attr = nullptr;
  PyObject* top_trace = nullptr;
  PyObject* axis_state = nullptr;
  PyObject* axis_attr = nullptr;
  PyObject* top_axis = nullptr;
  PyObject* clean = nullptr;
  bool tried = false;  // shardkit.jax._ops.activate was called (or failed)
};
Hook g_hook;

bool is_jax_value(nb::handle h) {
  PyTypeObject* t = Py_TYPE(h.ptr());
  return t == g_hook.array_type || t == g_hook.token_type ||
         (g_hook.tracer_type && PyType_IsSubtype(t, g_hook.tracer_type));
}

// True when no JAX transformation is tracing on this thread (concrete arrays are then used as they are).
bool at_top_level() {
  if (g_hook.trace_state) {
    nb::object trace = nb::steal(PyObject_GetAttr(g_hook.trace_state, g_hook.trace_attr));
    if (!trace.is_valid()) throw nb::python_error();
    if (trace.ptr() != g_hook.top_trace) return false;
    nb::object axis = nb::steal(PyObject_GetAttr(g_hook.axis_state, g_hook.axis_attr));
    if (!axis.is_valid()) throw nb::python_error();
    return axis.ptr() == g_hook.top_axis;
  }
  return nb::cast<bool>(nb::borrow(g_hook.clean)());
}

// Activates shardkit's JAX layer (shardkit.jax._ops.activate installs the hook) once JAX itself is loaded: JAX stays
// optional and is never imported by shardkit on its own. The layer is asked for by name, as shardkit._after_jax loads
// it: the plug-in's loading, not an import of the core's (no core module imports shardkit.jax; it imports them).
bool hook_ready() {
  if (g_hook.fn) return true;
  if (g_hook.tried) return false;
  static PyObject* key = PyUnicode_InternFromString("jax");  // its hash computed once: a lookup per call, no string
  if (!PyDict_GetItemWithError(PyImport_GetModuleDict(), key)) {
    if (PyErr_Occurred()) throw nb::python_error();
    return false;
  }
  g_hook.tried = true;
  nb::module_::import_("shardkit.jax._ops").attr("activate")();
  return g_hook.fn != nullptr;
}

}  // namespace

Communicator& jax_comm(std::int64_t handle, OpKind op) {
  // Every call of a compiled operation looks its communicator up: each thread remembers its last answers (one for
  // collectives, one for point-to-point), valid until the registry changes (entries never move or go before shutdown).
  struct Seen {
    std::int64_t handle = -1;
    std::uint64_t generation = 0;
    Communicator* comm = nullptr;
  };
  thread_local Seen seen[2];
  const bool collective = op_traits(op).collective;
  Seen& last = seen[collective ? 0 : 1];
  if (handle == last.handle && last.generation == g_registry_generation.load(std::memory_order_acquire))
    return *last.comm;
  std::lock_guard lock(g_registry_mutex);
  auto& r = registry();
  SHARDKIT_CHECK(handle >= 0 && handle < static_cast<std::int64_t>(r.size()), "unknown communicator handle ", handle,
                 " (communicators are released at shutdown)");
  const Registered& e = r[static_cast<std::size_t>(handle)];
  Communicator* c = !collective && e.p2p ? e.p2p.get() : e.jax.get();
  SHARDKIT_CHECK(c != nullptr, op_name(op), " on communicator '", e.original->name(),
                 "' in a compiled program that registered it for point-to-point operations only");
  last = Seen{handle, g_registry_generation.load(std::memory_order_relaxed), c};
  return *c;
}

namespace {
// The registered communicator under `handle` that compiled programs run collectives on, or where it has none yet (a
// communicator registered by point-to-point operations only), the one they run those on: rank, size and sequence.
Communicator& registered(std::int64_t handle) {
  std::lock_guard lock(g_registry_mutex);
  auto& r = registry();
  SHARDKIT_CHECK(handle >= 0 && handle < static_cast<std::int64_t>(r.size()), "unknown communicator handle ", handle,
                 " (communicators are released at shutdown)");
  const Registered& e = r[static_cast<std::size_t>(handle)];
  return e.jax ? *e.jax : *e.p2p;
}
}  // namespace

void clear_jax_comms() {
  std::vector<Registered> drop;
  {
    std::lock_guard lock(g_registry_mutex);
    drop.swap(registry());
    g_registry_generation.fetch_add(1, std::memory_order_release);
  }
}

bool jax_token(nb::handle t) { return g_hook.token_type && Py_TYPE(t.ptr()) == g_hook.token_type; }

namespace {

// The primitive's integer parameters (shardkit.jax._ops.bind) and the OpArgs fields they carry, one list both ways.
constexpr std::pair<const char*, int OpArgs::*> kIntParams[] = {{"root", &OpArgs::root},
                                                                {"dest", &OpArgs::dest},
                                                                {"source", &OpArgs::source},
                                                                {"send_tag", &OpArgs::send_tag},
                                                                {"recv_tag", &OpArgs::recv_tag}};

nb::dict params_of(const OpArgs& a) {
  nb::dict p;
  p["reduce"] = static_cast<int>(a.reduce);
  for (const auto& [name, field] : kIntParams) p[name] = a.*field;
  return p;
}

OpArgs args_of(nb::dict p) {
  OpArgs a;
  a.reduce = static_cast<ReduceOp>(nb::cast<int>(p["reduce"]));
  for (const auto& [name, field] : kIntParams) a.*field = nb::cast<int>(p[name]);
  return a;
}

}  // namespace

bool jax_dispatch(OpKind op, const FastArgs& a, nb::handle comm, nb::object* out) {
  nb::handle x = a.get(op == OpKind::kSendrecv ? Field::kSendbuf : Field::kX);
  nb::handle token = a.get(Field::kToken);
  // The NumPy hot path: NumPy arrays and no token pay a few comparisons. NumPy calls are the mpi4py-like host path
  // also while JAX traces (they run when traced, not when the compiled program runs); JAX loaded for nothing else is
  // never started by them.
  if (token.is_none() && op != OpKind::kBarrier && is_ndarray(x) &&
      (op != OpKind::kSendrecv || is_ndarray(a.get(Field::kRecvbuf))))
    return false;
  if (!hook_ready()) return false;
  // Outside any trace the native path runs the call on concrete arrays directly (jax.Arrays through the buffer
  // protocol, results back as jax.Arrays), with or without a JAX token (complete outside a trace): every eager call of
  // a communicator runs on the communicator itself, so eager sends and receives match whatever tokens they carry
  // (compiled programs use its duplicate).
  if (at_top_level()) return false;
  // While JAX traces: a call with a JAX value among its arrays (sendrecv's NumPy sendbuf then becomes a constant of
  // the program) or a JAX token is staged; barrier asks the hook.
  const bool jax_input = is_jax_value(x) || is_jax_value(token) ||
                         (op == OpKind::kSendrecv && is_jax_value(a.get(Field::kRecvbuf)));
  if (!jax_input && op != OpKind::kBarrier) return false;
  // The call bound as the native path binds it (one step: reductions, mpi4py's wildcards, tags), handed over as the
  // primitive's operands (sendrecv: the receive template, then the send buffer) and parameters.
  const BoundCall b = bind_call(op, a);
  note_call_site();  // the traced call's site, carried by the primitive to the compiled call (flight recorder)
  nb::dict params = params_of(b.args);
  params["site"] = call_site_id(current_call_site());
  nb::tuple operands = op == OpKind::kSendrecv ? nb::make_tuple(b.x, b.sendbuf)
                       : op == OpKind::kBarrier ? nb::tuple()
                                                : nb::make_tuple(b.x);
  nb::object r = nb::borrow(g_hook.fn)(op_name(op), operands, params, b.status, b.token, comm);
  if (r.ptr() == Py_NotImplemented) return false;
  *out = std::move(r);
  return true;
}

bool jax_tracer(nb::handle x) {
  if (is_ndarray(x) || !hook_ready()) return false;
  return g_hook.tracer_type && PyType_IsSubtype(Py_TYPE(x.ptr()), g_hook.tracer_type);
}

namespace {
// shardkit.jax._ops's wait for the compiled programs dispatched so far (the module holds the reference), run by the
// eager calls that launch on NCCL (launch_fence.hpp), from a thread that may not hold the GIL.
PyObject* g_fence = nullptr;

void run_python_fence() {
  nb::gil_scoped_acquire gil;
  if (!g_fence) return;
  PyObject* r = PyObject_CallNoArgs(g_fence);
  if (!r) throw nb::python_error();
  Py_DECREF(r);
}
}  // namespace

void register_jax(nb::module_& m) {
  m.def("_set_nccl_launch_fence", [m](nb::object fn) {
    m.attr("_nccl_launch_fence") = fn;
    g_fence = fn.is_none() ? nullptr : fn.ptr();
    set_nccl_launch_fence(fn.is_none() ? std::function<void()>() : run_python_fence);
  }, nb::arg("fn").none(),
     "Sets what an eager call on device buffers runs before its NCCL launch (None: nothing): shardkit.jax._ops waits "
     "for the compiled programs dispatched before, so that every rank launches on NCCL in program order.");
  m.attr("_nccl_launch_fence") = nb::none();
  m.def("_call_site_id", [] {
    note_call_site();
    return call_site_id(current_call_site());
  }, "The id of the innermost Python frame outside the shardkit package as a call site (0: none; the flight "
     "recorder off), which a traced operation carries to its compiled call.");
  m.def("_jax_comm_handle", [](nb::handle comm, std::optional<std::string> op) {
    return register_comm(comm_from(comm), op ? op_from_name(*op) : OpKind::kBarrier);
  }, nb::arg("comm").none(), nb::arg("op").none() = nb::none(),
        "The integer handle compiled programs use for a communicator, for operation `op` (None: a collective): a "
        "duplicate made at the first registration (collective), kept until shutdown; on an mpi4py communicator, "
        "point-to-point operations take a second wrapping of it, made without the other ranks.");
  m.def("_jax_comm_info", [](std::int64_t h) {
    Communicator& c = registered(h);
    return nb::make_tuple(c.rank(), c.size());
  }, "(rank, size) of a registered communicator.");
  m.def("_jax_comm_sequence", [](std::int64_t h) { return registered(h).sequence(); },
        "Operations issued so far on a registered communicator's duplicate (what compiled programs ran).");
  m.def("_op_code", [](const std::string& name) { return static_cast<int>(op_from_name(name)); },
        "The operation table's index of an operation name.");
  m.def("_value_shape", [](const std::string& name, const Shape& shape, int rank, int size, int root) {
    return value_shape(op_from_name(name), shape, rank, size, root);
  }, "The value form's result shape (the operation table's rule), raising InvalidArgument where the rule does.");
  m.def("_check_value", [](const std::string& name, nb::handle comm, nb::list avals, nb::dict params) {
    auto as_array = [](nb::handle aval) {
      return Array::shape_only(nb::cast<Shape>(aval[0]), dtype_from_name(nb::cast<std::string>(aval[1])));
    };
    const Array x = avals.size() > 0 ? as_array(avals[0]) : Array::shape_only({0}, DType::kFloat32);
    std::optional<Array> send;
    OpArgs a = args_of(params);
    if (avals.size() > 1) a.send = &send.emplace(as_array(avals[1]));
    // The caller's communicator, not its duplicate for compiled programs: the messages name what the caller named.
    comm_from(comm, name.c_str())->check_value(op_from_name(name), x, a);
  }, nb::arg("op"), nb::arg("comm").none(), nb::arg("avals"), nb::arg("params"),
     "Checks a traced call (operands as (shape, dtype name), the bound parameters) as the eager call would be "
     "checked (Communicator::check_value), raising its InvalidArgument while tracing.");
  m.def("_set_jax_hook", [m](nb::object fn, nb::object array_type, nb::object tracer_type, nb::object token_type,
                             nb::object trace_clean, nb::object trace_probe, nb::object importer,
                             nb::object importer_args) {
    // The module holds the references (released with it at shutdown); the hook borrows them.
    m.attr("_jax_hook_refs") = nb::make_tuple(fn, array_type, tracer_type, token_type, trace_clean, trace_probe,
                                              importer, importer_args);
    g_hook.fn = fn.ptr();
    g_hook.array_type = reinterpret_cast<PyTypeObject*>(array_type.ptr());
    g_hook.tracer_type = reinterpret_cast<PyTypeObject*>(tracer_type.ptr());
    g_hook.token_type = reinterpret_cast<PyTypeObject*>(token_type.ptr());
    g_hook.clean = trace_clean.ptr();
    if (!trace_probe.is_none()) {
      nb::tuple p = nb::cast<nb::tuple>(trace_probe);
      SHARDKIT_CHECK_EQ(p.size(), 6u, "trace probe: (trace state, attribute, top-level trace, axis state, attribute, "
                        "top-level axis env)");
      SHARDKIT_CHECK(nb::isinstance<nb::str>(p[1]) && nb::isinstance<nb::str>(p[4]),
                     "trace probe: the attribute names are strings");
      g_hook.trace_state = p[0].ptr();
      g_hook.trace_attr = p[1].ptr();
      g_hook.top_trace = p[2].ptr();
      g_hook.axis_state = p[3].ptr();
      g_hook.axis_attr = p[4].ptr();
      g_hook.top_axis = p[5].ptr();
    }
    set_jax_host(array_type, importer, importer_args);
    g_hook.tried = true;
  }, "Installs shardkit.jax._ops: its dispatch function, JAX's value types, how to tell that JAX is tracing "
     "(trace_state_clean, or a (state, attribute, value, state, attribute, value) probe of it; None: call the "
     "function) and jaxlib's DLPack importer for eager results (None: jax.dlpack).",
     nb::arg("fn"), nb::arg("array_type"), nb::arg("tracer_type"), nb::arg("token_type"), nb::arg("trace_clean"),
     nb::arg("trace_probe").none(), nb::arg("importer").none(), nb::arg("importer_args").none());
  m.def("_jax_ffi_targets", [] {
    nb::dict d;
#ifdef SHARDKIT_HAVE_JAX_FFI
    for (auto& [name, fn] : jax_ffi_handlers()) d[name.c_str()] = nb::steal(PyCapsule_New(fn, nullptr, nullptr));
#endif
    return d;
  }, "The XLA FFI handlers built into this extension, by target name (empty when built without jaxlib's headers).");
}

}  // namespace shardkit::py
