#pragma once

// The shm backend of a communicator whose ranks span several nodes: hierarchical collectives (as Open MPI's coll/han).
// Each node's ranks run the shm backend over a node communicator (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)); one
// leader per node (its lowest rank) runs MPI with the other leaders; the node's shm backend hands the result out.
//
//   allreduce       shm reduce to the leader, MPI allreduce among leaders, shm bcast from the leader
//   reduce          shm reduce to each leader, MPI reduce to the root's leader, MPI send to the root when it is not one
//   bcast           shm bcast on the root's node when the root is not its leader, MPI bcast among leaders, shm bcast on
//                   the other nodes (and on the root's node when the root leads it)
//   barrier         shm barrier, MPI barrier among leaders, shm barrier
//   allgather       shm allgather of the node's blocks, MPI allgatherv of the nodes' among leaders, put in rank order
//                   by the leader, shm bcast from the leader
//   reduce_scatter  shm reduce of the whole input to the leader, its blocks put node by node, MPI reduce_scatter
//                   among leaders (each node's part to its leader), shm bcast of that part, each rank keeping its block
//
// Only the order of reduction differs from MPI's (node by node): exact results are the same, rounded ones may differ
// in the last bits from the flat route's (every rank gets the same bits). A node's ranks need not be contiguous in the
// communicator: allgather and reduce_scatter, whose blocks are in communicator rank order, permute them between rank
// order and node by node on the leaders (no copy where the two are one). Messages (a rank that did not arrive) name
// ranks of the communicator, not of the node.

#include <cstdint>
#include <memory>
#include <string>

#include "backend.hpp"

namespace shardkit::detail {

/// The operations the hierarchical backend implements (reductions: the defined ones).
bool hier_supports(OpKind op, DType dtype, ReduceOp reduce) noexcept;

/// The hierarchical backend over `comm` when its ranks are on more than one node. Else nullptr on every rank:
/// `*spans_nodes` false when they are all on one node (make_shm_backend then applies), true with the reason in `why`
/// when some node's shared segment could not be made. Collective with blocking MPI calls on `comm`: every rank must be
/// known to have arrived (agree_within_operation) first. `options`: the communicator's (its max_message_elements
/// and the shm settings of each node's part).
std::unique_ptr<Backend> make_hier_backend(MpiCommHandle comm, std::shared_ptr<AbortState> abort_state,
                                           const CommOptions& options, bool* spans_nodes, std::string* why);

}  // namespace shardkit::detail
