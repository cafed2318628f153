#pragma once

// The MPI backend (mpi_backend.cpp), made by the MPI transport (mpi_transport.cpp) and by the hierarchical shm
// backend for its node and leader communicators.

#include <cstdint>
#include <functional>
#include <memory>

#include "backend.hpp"

namespace shardkit::detail {

/// What the MPI backend implements: every operation on every dtype and defined reduction (host memory, or device
/// memory staged through pinned buffers).
bool mpi_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;

/// The MPI backend over `comm` (borrowed: it must outlive the backend). `internal` gives the communicator the
/// backend uses for its own point-to-point traffic (large-count fallbacks), created on first use (collective).
/// `max_count` is the largest element count of one MPI call (CommOptions::max_message_elements).
std::unique_ptr<Backend> make_mpi_backend(MpiCommHandle comm, std::function<MpiCommHandle()> internal,
                                          std::shared_ptr<AbortState> abort_state, std::int64_t max_count);

}  // namespace shardkit::detail
