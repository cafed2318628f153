// Communicators and tokens in Python: the Communicator and Token classes, the default (world) communicator, mpi4py
// communicators wrapped and cached, and communicators with their own settings. The operations are bound in py_ops.cpp.

#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cctype>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "py_array.hpp"
#include "py_comm.hpp"
#include "py_sharding.hpp"
#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/runtime.hpp"

namespace shardkit::py {

namespace {

// ---- communicator caches ---------------------------------------------------------------------------------------------

CommPtr g_world;  // the default communicator: a clone of COMM_WORLD

// Communicators wrapping mpi4py ones are cached on the MPI communicator itself (an MPI attribute), so the cache
// follows the communicator's life: freeing it runs delete_attr, and a handle reused later starts afresh.
int g_keyval = MPI_KEYVAL_INVALID;
std::mutex g_wrapped_mu;
std::vector<MPI_Comm> g_wrapped;  // communicators carrying our attribute, to clear at shutdown

int delete_attr(MPI_Comm comm, int, void* value, void*) {
  delete static_cast<CommPtr*>(value);
  std::lock_guard<std::mutex> lock(g_wrapped_mu);
  std::erase(g_wrapped, comm);
  return MPI_SUCCESS;
}

CommPtr wrap_mpi4py(std::uintptr_t handle) {
  MPI_Comm c = to_mpi<MPI_Comm>(handle);
  SHARDKIT_CHECK(c != MPI_COMM_NULL, "comm: MPI.COMM_NULL is not a communicator");
  if (g_keyval == MPI_KEYVAL_INVALID)
    SHARDKIT_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_attr, &g_keyval, nullptr));
  void* value = nullptr;
  int found = 0;
  SHARDKIT_MPI_CHECK(MPI_Comm_get_attr(c, g_keyval, &value, &found));
  if (found) return *static_cast<CommPtr*>(value);
  CommOptions o;
  o.name = "mpi4py communicator";
  CommPtr comm = Communicator::wrap_mpi(handle, o);
  SHARDKIT_MPI_CHECK(MPI_Comm_set_attr(c, g_keyval, new CommPtr(comm)));
  std::lock_guard<std::mutex> lock(g_wrapped_mu);
  g_wrapped.push_back(c);
  return comm;
}

CommPtr world(const char* first_op = nullptr) {
  if (!g_world) {
    {
      nb::gil_scoped_release release;
      CommOptions o;
      o.name = "world";
      g_world = Communicator::world(Runtime::instance(), o, first_op ? first_op : "");
    }
#ifdef SHARDKIT_HAVE_JAX_FFI
    // Its duplicate for compiled programs, now, while every rank is here (the first use of the default communicator is
    // collective): made at a first trace instead, a compiled exchange between two ranks would wait for all of them.
    register_comm(g_world);
#endif
  }
  return g_world;
}

// "SUM" for kSum: mpi4py's operations and the ReduceOp members are the reductions' names in upper case.
std::string upper_name(ReduceOp op) {
  std::string name = reduce_op_name(op);
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return name;
}

// ---- value forms: import, run without the GIL, export ----------------------------------------------------------------

// A complete token is the same Python object every time (tokens are immutable): no allocation per call. The module
// owns it (attribute _complete_token), so it goes away with the module.
nb::handle g_complete_token;

}  // namespace

nb::object token_object(const Token& t) {
  return t.waitable() ? nb::cast(t) : nb::borrow(g_complete_token);
}

const Mpi4py* mpi4py_api() {
  static Mpi4py* api = nullptr;  // interpreter lifetime (never decref'd after finalisation)
  if (!api && PyDict_GetItemString(PyImport_GetModuleDict(), "mpi4py.MPI")) {
    nb::module_ MPI = nb::module_::import_("mpi4py.MPI");
    auto* a = new Mpi4py();
    a->comm_type = MPI.attr("Comm");
    a->handleof = MPI.attr("_handleof");
    if (nb::hasattr(MPI, "__pyx_capi__")) {
      nb::object capi = MPI.attr("__pyx_capi__");
      if (PyDict_Check(capi.ptr()))
        if (PyObject* cap = PyDict_GetItemString(capi.ptr(), "PyMPIComm_Get"); cap && PyCapsule_CheckExact(cap)) {
          // The capsule's name is the C signature; only the one we call through is accepted.
          if (const char* sig = PyCapsule_GetName(cap); sig && std::string_view(sig) == "MPI_Comm *(PyObject *)")
            a->comm_get = reinterpret_cast<void* (*)(PyObject*)>(PyCapsule_GetPointer(cap, sig));
        }
      PyErr_Clear();
    }
    for (int i = 0; i < kReduceOpCount; ++i) {  // MPI.SUM, ...: the reductions' names in upper case
      nb::object o = MPI.attr(upper_name(static_cast<ReduceOp>(i)).c_str());
      a->ops[o.ptr()] = static_cast<ReduceOp>(i);
      a->keep.push_back(o);
    }
    a->any_source = nb::cast<int>(MPI.attr("ANY_SOURCE"));
    a->any_tag = nb::cast<int>(MPI.attr("ANY_TAG"));
    api = a;
  }
  return api;
}

// A communicator from what Python passes as `comm`: None (the world clone), ours, or an mpi4py communicator.
CommPtr comm_from(nb::handle h, const char* first_op) {
  if (h.is_none()) return world(first_op);
  if (nb::isinstance<Communicator>(h)) return nb::cast<CommPtr>(h);
  if (const Mpi4py* api = mpi4py_api()) {  // an mpi4py object implies mpi4py.MPI is loaded
    if (PyObject_TypeCheck(h.ptr(), reinterpret_cast<PyTypeObject*>(api->comm_type.ptr()))) {
      if (api->comm_get) {
        auto* handle = static_cast<MPI_Comm*>(api->comm_get(h.ptr()));
        if (!handle) throw nb::python_error();
        return wrap_mpi4py(::shardkit::from_mpi(*handle));
      }
      return wrap_mpi4py(nb::cast<std::uintptr_t>(api->handleof(h)));
    }
  }
  throw InvalidArgument(std::string("comm must be None, a shardkit Communicator or an mpi4py communicator, got ") +
                        nb::type_name(h.type()).c_str());
}

void clear_communicator_caches() {
  clear_jax_comms();
  std::vector<MPI_Comm> wrapped;
  {
    std::lock_guard<std::mutex> lock(g_wrapped_mu);
    wrapped = g_wrapped;
  }
  if (!mpi_finalized())
    for (MPI_Comm c : wrapped) MPI_Comm_delete_attr(c, g_keyval);  // runs delete_attr, which drops our reference
  g_world.reset();
}

void register_collectives(nb::module_& m) {
  nb::enum_<ReduceOp> reduce_op(m, "ReduceOp", nb::is_arithmetic());
  for (int i = 0; i < kReduceOpCount; ++i)  // SUM, PROD, ...: the reductions' names in upper case
    reduce_op.value(upper_name(static_cast<ReduceOp>(i)).c_str(), static_cast<ReduceOp>(i));

  nb::class_<Token>(m, "Token", "Orders execution: operations given a token start after the one that produced it.")
      .def(nb::init<>())
      .def("wait", &Token::wait, nb::call_guard<nb::gil_scoped_release>(),
           "Blocks until complete (re-raises the operation's error).")
      .def("is_complete", &Token::is_complete)
      .def_static("join", &Token::join, "A token complete when both are.")
      .def("__repr__", [](const Token& t) { return t.is_complete() ? "Token(complete)" : "Token(pending)"; });

  nb::class_<Communicator>(m, "Communicator", "A group of ranks running collectives (MPI for host, NCCL for GPU).")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("name", &Communicator::name)
      .def_prop_ro("has_nccl", &Communicator::has_nccl)
      .def_prop_ro("backend", [](const Communicator& c) { return backend_name(c.options().backend); },
                   "The backend setting it was made with: 'auto', 'mpi', 'nccl' or 'shm' (make_comm's backend=).")
      .def_prop_ro("timeout", [](const Communicator& c) { return c.options().timeout.count() / 1000.0; },
                   "Its timeout in seconds (0: none).")
      .def_prop_ro("check", [](const Communicator& c) { return c.options().check; }, "Whether it runs checked mode.")
      .def_prop_ro("trace_buffer", [](const Communicator& c) { return c.options().trace_buffer; },
                   "Operations its flight recorder keeps (0: none; make_comm's trace_buffer=).")
      .def_prop_ro("shm_single_copy", [](const Communicator& c) { return c.options().shm_single_copy; },
                   "Whether the shm transport may read other ranks' memory for large messages.")
      .def_prop_ro("shm_pending_bytes", [](const Communicator& c) { return c.options().shm_pending_bytes; },
                   "Bytes of eager shm sends a rank may hold back before a send waits for its receiver.")
      .def("transport_for", [](const Communicator& c, const std::string& op, const std::string& device) {
        return backend_name(c.backend_for(op_from_name(op), *device_from(device)));
      }, nb::arg("op"), nb::arg("device") = "cpu",
         "The transport ('mpi', 'nccl' or 'shm') that would run operation `op` ('allreduce', ...) on buffers on "
         "`device` ('cpu', 'cuda', 'cuda:N') now.")
      .def_prop_ro("aborted", &Communicator::aborted)
      .def_prop_ro("sequence", &Communicator::sequence)
      .def_prop_ro("handle", [](const Communicator& c) { return static_cast<std::uintptr_t>(c.mpi_handle()); },
                   "The MPI_Comm as an integer (MPI._handleof style).")
      .def("split", &Communicator::split, nb::arg("color"), nb::arg("key"), nb::arg("name") = "",
           nb::call_guard<nb::gil_scoped_release>())
      .def("dup", &Communicator::dup, nb::arg("name") = "", nb::call_guard<nb::gil_scoped_release>())
      .def("__repr__", [](const Communicator& c) {
        return detail::concat("Communicator('", c.name(), "', rank=", c.rank(), ", size=", c.size(), ")");
      });
  // The operations (allreduce, ..., mpi4jax's signatures without comm) are bound by register_ops (py_ops.cpp).

  m.attr("_complete_token") = nb::cast(Token());
  g_complete_token = m.attr("_complete_token");
  m.def("world", [] { return world(); }, "The default communicator: a clone of MPI_COMM_WORLD (created once).");
  m.def("comm", [](nb::handle h) { return comm_from(h); }, nb::arg("comm").none(),
        "The communicator for a `comm` argument: None (a clone of COMM_WORLD), a Communicator, or an mpi4py Comm.");
  m.def("wrap_mpi4py", &wrap_mpi4py, nb::arg("handle"),
        "The communicator running on an mpi4py communicator (by MPI._handleof), cached on it.");
  m.def("from_mpi4py", [](std::uintptr_t handle, const std::string& name) {
    CommOptions o;
    o.name = name;
    nb::gil_scoped_release release;
    return Communicator::from_mpi(handle, o);
  }, nb::arg("handle"), nb::arg("name") = "mpi4py duplicate",
     "A new communicator over a duplicate of an mpi4py communicator (collective).");
  m.def("make_comm", [](nb::handle base, std::optional<bool> check, std::optional<double> timeout_s, bool async,
                        const std::string& name, std::optional<std::string> backend, std::optional<bool> verbose,
                        std::optional<std::int64_t> trace_buffer, std::optional<bool> shm_single_copy,
                        std::optional<std::int64_t> shm_pending_bytes) {
    CommPtr b = comm_from(base);
    CommOptions o = b->options();
    if (check) o.check = *check;
    if (timeout_s) {
      if (!(*timeout_s >= 0 && *timeout_s <= 1e9))
        throw InvalidArgument(detail::concat("make_comm: timeout=", *timeout_s,
                                             ": expected a non-negative number of seconds (0: none)"));
      o.timeout = std::chrono::milliseconds(static_cast<long long>(*timeout_s * 1000.0));
    }
    if (backend) {
      const std::optional<BackendKind> kind = backend_from_name(*backend);
      if (!kind)
        throw InvalidArgument(detail::concat("make_comm: backend='", *backend, "': expected auto, mpi, nccl or shm"));
      o.backend = *kind;
    }
    auto count = [](const char* what, std::optional<std::int64_t> v, std::size_t& into) {
      if (!v) return;
      if (*v < 0) throw InvalidArgument(detail::concat("make_comm: ", what, "=", *v, ": expected a count >= 0"));
      into = static_cast<std::size_t>(*v);
    };
    count("trace_buffer", trace_buffer, o.trace_buffer);
    count("shm_pending_bytes", shm_pending_bytes, o.shm_pending_bytes);
    if (verbose) o.verbose = *verbose;
    if (shm_single_copy) o.shm_single_copy = *shm_single_copy;
    o.async = async;
    o.name = name;
    nb::gil_scoped_release release;
    return Communicator::from_mpi(b->mpi_handle(), o);
  }, nb::arg("base") = nb::none(), nb::kw_only(), nb::arg("check") = nb::none(), nb::arg("timeout") = nb::none(),
     nb::arg("async_") = false, nb::arg("name") = "communicator", nb::arg("backend") = nb::none(),
     nb::arg("verbose") = nb::none(), nb::arg("trace_buffer") = nb::none(), nb::arg("shm_single_copy") = nb::none(),
     nb::arg("shm_pending_bytes") = nb::none(),
     "A new communicator over the ranks of `base` (a duplicate: its own message space) with its own settings: "
     "checked mode, timeout in seconds (0: none), asynchronous MPI, backend ('auto', 'mpi', 'nccl' or 'shm'; as "
     "SHARDKIT_BACKEND), verbose creation, the flight recorder's ring (operations; 0: none), the shm transport's "
     "single copy and its bound on held-back eager sends (bytes). What is not given is `base`'s. Collective.");
  m.attr("ANY_SOURCE") = kAnySource;
  m.attr("ANY_TAG") = kAnyTag;
}

}  // namespace shardkit::py
