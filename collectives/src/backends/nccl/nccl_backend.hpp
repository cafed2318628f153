#pragma once

// The NCCL backend (nccl_backend.cpp; nccl_stub.cpp in builds without NCCL), made by the NCCL transport.

#include <chrono>
#include <memory>

#include "backend.hpp"

namespace shardkit::detail {

/// What the NCCL backend implements (declared in every build, NCCL or not): no scan or barrier; the reductions its
/// table gives an NCCL form (nccl_caps.hpp: complex as pairs of reals for sum only; bool for logical/bitwise and/or
/// only; float32/float64 max/min over order keys, in allreduce only); data movement on every dtype.
bool nccl_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;

/// True when this build has NCCL.
bool nccl_built() noexcept;
/// The NCCL backend over the ranks of `mpi_comm` on `device` (bootstrapped over `mpi_comm`). Collective. Creation
/// is non-blocking and polled: past `timeout` (0: none) the communicator is aborted and TimeoutError thrown.
std::unique_ptr<Backend> make_nccl_backend(MpiCommHandle mpi_comm, int device, std::shared_ptr<AbortState> abort_state,
                                           std::chrono::milliseconds timeout);
/// An NCCL backend split from `parent` (ncclCommSplit). Collective over the parent; color < 0 gives nullptr.
/// Same deadline rule as make_nccl_backend.
std::unique_ptr<Backend> split_nccl_backend(Backend& parent, int color, int key,
                                            std::shared_ptr<AbortState> abort_state, std::chrono::milliseconds timeout);

}  // namespace shardkit::detail
