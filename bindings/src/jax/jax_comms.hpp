#pragma once

// The communicators that compiled JAX programs name by an integer handle (as mpi4jax passes an MPI_Comm handle): what
// the XLA FFI handlers (ffi_handlers.cpp) need of the JAX layer, without Python, so that they also build into C++
// tests.

#include <cstdint>

#include "shardkit/collectives/communicator.hpp"

namespace shardkit::py {

/// The communicator that compiled programs run `op` on, for the one registered under `handle` by
/// shardkit._core._jax_comm_handle. Lives as long as the interpreter.
/// @throws InvalidArgument for a handle never registered (or, for a collective, registered by point-to-point
/// operations only).
Communicator& jax_comm(std::int64_t handle, OpKind op);

}  // namespace shardkit::py
