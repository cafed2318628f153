#pragma once

// Communicators and operations between Python and C++: what the binding files share (communicators defined in
// bind_collectives.cpp, operations in py_ops.cpp).

#include <nanobind/nanobind.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "py_array.hpp"
#include "shardkit/collectives/communicator.hpp"

namespace shardkit::py {

namespace nb = nanobind;
class FastArgs;  // py_fastcall.hpp
using CommPtr = std::shared_ptr<Communicator>;

/// The communicator a `comm=` argument names: None (the default, a clone of COMM_WORLD), a shardkit Communicator or
/// an mpi4py communicator (wrapped once and cached on the MPI communicator).
/// `first_op`: the operation this communicator is for; when it makes the default communicator (the first call), a
/// timeout there names that operation.
/// @throws InvalidArgument for anything else.
CommPtr comm_from(nb::handle h, const char* first_op = nullptr);

/// The Python object for a token; a complete token is one shared object (no allocation per call).
nb::object token_object(const Token& t);

/// Drops the cached default and mpi4py-wrapping communicators (before MPI_Finalize).
void clear_communicator_caches();

/// Registers `c` for compiled JAX programs (jax/bind_jax.cpp), for a traced operation `op`: the handle they name it by.
/// Compiled programs run on a duplicate of `c`, made the first time (collective over c), but for point-to-point
/// operations on a caller's (mpi4py) communicator, which run on a second wrapping of it, made without the other ranks.
std::int64_t register_comm(const CommPtr& c, OpKind op = OpKind::kBarrier);

/// Drops the communicators registered for compiled JAX programs (jax/bind_jax.cpp; part of the above).
void clear_jax_comms();

/// True when an operation on host buffers is over when the call returns, failed or not: blocking MPI (no timeout,
/// not async) keeps no reference to its buffers, so NumPy arrays that the calling binding itself holds need no owner.
inline bool completes_in_call(const Communicator& c) {
  return !c.options().async && c.options().timeout.count() == 0;
}

// ---- operations (py_ops.cpp) ----------------------------------------------------------------------------------------

/// A reduction from Python: an mpi4py operation (MPI.SUM, ...), a name ("sum", ...) or a ReduceOp (or its int value).
/// @throws InvalidArgument for anything else.
ReduceOp reduce_op_of(nb::handle op);

/// A token from Python: a shardkit Token, or None or a JAX token (complete). @throws TypeError for anything else.
Token token_of(nb::handle t);

/// One call of an operation from Python, its operands and arguments bound once for every path: the native call
/// (py_ops.cpp's call_op) and the JAX layer's (jax/bind_jax.cpp's jax_dispatch, which hands it to shardkit.jax._ops).
struct BoundCall {
  OpArgs args;          ///< reduction, root, peers and tags (mpi4py's wildcards as shardkit's); no buffers
  nb::handle x;         ///< the value form's input: x, or sendrecv's recvbuf (which gives shape and dtype); None
  nb::handle sendbuf;   ///< sendrecv's send buffer; null for the others
  nb::handle status;    ///< an mpi4py Status to fill, or None
  nb::handle token;     ///< the caller's token, or None
};
/// @throws InvalidArgument for an unknown reduction; TypeError, OverflowError for integers that are not.
BoundCall bind_call(OpKind op, const FastArgs& a);

/// Runs one call of `op` from Python (either view, the communicator given) and returns its result as the view
/// promises: (result, token), or a token for send and barrier. JAX values were handed to shardkit.jax._ops before.
nb::object call_op(OpKind op, const FastArgs& a, Communicator& c);
/// Sets the calling thread's call site (flight recorder) to the innermost Python frame outside the shardkit package.
void note_call_site();

/// The value form of `op` on the Python array `x` (any framework): `args` gives everything but the buffers, `token` is
/// the one to start after and becomes the operation's. A host NumPy input gets a NumPy result allocated here and filled
/// in place, complete on return; other inputs go through Communicator::run_value and come back in their framework.
/// `jax_result`: the result is a jax.Array whatever x is (sendrecv with a JAX sendbuf: mpi4jax returns JAX arrays).
nb::object value_py(Communicator& c, OpKind op, nb::handle x, OpArgs& args, Token& token, bool jax_result = false);

/// What shardkit recognises of mpi4py.MPI, looked up once the module is loaded: looking it up per call (an import and
/// a type's __module__) would cost more than a small collective.
struct Mpi4py {
  nb::object comm_type;  ///< mpi4py.MPI.Comm (Intracomm, Cartcomm, ... derive from it)
  nb::object handleof;   ///< mpi4py.MPI._handleof
  /// mpi4py's C API function PyMPIComm_Get (from MPI.__pyx_capi__, as mpi4py's own C header imports it): the address
  /// of a Comm object's MPI_Comm, without a Python call. nullptr if this mpi4py does not export it.
  void* (*comm_get)(PyObject*) = nullptr;
  std::unordered_map<PyObject*, ReduceOp> ops;  ///< MPI.SUM, ...: Op objects are singletons, looked up by identity
  std::vector<nb::object> keep;                 ///< references to those Op objects, so their addresses stay theirs
  int any_source = kAnySource;
  int any_tag = kAnyTag;
};

/// mpi4py.MPI's objects, or nullptr while the module is not loaded (an mpi4py object implies it is). Lives as long as
/// the interpreter.
const Mpi4py* mpi4py_api();

}  // namespace shardkit::py
