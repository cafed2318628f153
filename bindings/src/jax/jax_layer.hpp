#pragma once

// What the JAX layer shares between the bindings (bind_jax.cpp) and the XLA FFI handlers (ffi_handlers.cpp): the
// communicators that compiled programs name by an integer handle (as mpi4jax passes an MPI_Comm handle), and the
// hand-over of shardkit.mpi calls whose arguments are JAX values to the Python JAX layer (shardkit._jax).

#include <nanobind/nanobind.h>

#include <cstdint>

#include "../py_fastcall.hpp"
#include "jax_comms.hpp"

namespace shardkit::py {

/// When the JAX layer is (or can be) loaded and `a` holds a JAX array, tracer or token as its array or token argument,
/// runs the call through it (shardkit._jax) and returns true with the call's result in `out`. Costs a type comparison
/// when the argument is a NumPy array.
bool jax_dispatch(OpKind op, const FastArgs& a, nb::handle comm, nb::object* out);

/// True when `x` is a JAX tracer (JAX is loaded and x derives from jax.core.Tracer). A type comparison for NumPy arrays.
bool jax_tracer(nb::handle x);

}  // namespace shardkit::py
