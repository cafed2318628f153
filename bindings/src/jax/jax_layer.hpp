#pragma once

// What the JAX layer shares between the bindings (bind_jax.cpp) and the XLA FFI handlers (ffi_handlers.cpp): the
// communicators that compiled programs name by an integer handle (as mpi4jax passes an MPI_Comm handle), and the
// hand-over of shardkit.mpi calls whose arguments are JAX values to the Python JAX layer (shardkit.jax).

#include <nanobind/nanobind.h>

#include <cstdint>

#include "../py_fastcall.hpp"
#include "jax_comms.hpp"

namespace shardkit::py {

/// When the JAX layer is (or can be) loaded and `a` holds a JAX array, tracer or token among its arrays or as its
/// token, and JAX is tracing or the token is a JAX token, runs the call through it (shardkit.jax._ops) and returns true
/// with the call's result in `out`; otherwise false (the native path runs it). Costs a few type comparisons when the
/// arrays are NumPy arrays (which always take the native path).
bool jax_dispatch(OpKind op, const FastArgs& a, nb::handle comm, nb::object* out);

/// True when `t` is a JAX token (jax.core.Token; JAX's layer is loaded).
bool jax_token(nb::handle t);

/// True when `x` is a JAX tracer (JAX is loaded and x derives from jax.core.Tracer). A type comparison for NumPy arrays.
bool jax_tracer(nb::handle x);

}  // namespace shardkit::py
