#pragma once

// The flat shm backend (shm_backend.cpp): the ranks of one node over a shared segment. Made by the shm transport and,
// for each node, by the hierarchical backend (hierarchy.hpp).

#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"

namespace shardkit::detail {

struct WaitPolicy;  // shm_segment.hpp

/// What the shm backend implements: allreduce, reduce, reduce_scatter (every defined reduction), bcast, allgather,
/// alltoall, gather, scatter, barrier and point-to-point, on host buffers.
bool shm_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;
/// The shm backend over the ranks of `comm` when they are all on one node and a shared segment could be made and
/// mapped by every rank; else nullptr on every rank, with the reason in `why`. Collective, with blocking MPI calls on
/// `comm`: every rank must be known to have arrived (agree_to_create) first. `rank_names`: the number its messages
/// give each rank of `comm` (empty: its rank in `comm`), e.g. its rank in a communicator `comm` is a node's part of.
/// `policy`: how its ranks wait (nullptr: WaitPolicy::for_comm; tests give one, e.g. a CPU per rank where the machine
/// has fewer). `options`: the communicator's (its shm_single_copy and shm_pending_bytes).
std::unique_ptr<Backend> make_shm_backend(MpiCommHandle comm, std::shared_ptr<AbortState> abort_state,
                                          std::string* why, std::vector<int> rank_names = {},
                                          const WaitPolicy* policy = nullptr, const CommOptions& options = {});

}  // namespace shardkit::detail
