#pragma once

// How reshard moves a global array from one sharding to another: a plan (a pure function of the two shardings,
// the global shape and a rank, so it can be checked without processes) and the reshard that carries it out.

#include <cstdint>
#include <string>
#include <vector>

#include "shardkit/sharding/named_sharding.hpp"

namespace shardkit {

/// A block of a global array: one index range per dimension (global coordinates).
using Box = std::vector<IndexRange>;

/// What reshard does, from cheapest to dearest.
enum class ReshardKind {
  kKeep,       ///< every rank already holds its target block: no copy, no communication
  kLocal,      ///< every rank's target block lies inside the block it holds: a local slice
  kAllGather,  ///< one all_gather(v) over the communicator of `gather_axes` (the source's blocks along them tile
               ///< the target block)
  kAllToAll,   ///< one all_to_all-v over the mesh communicator
};
/// "keep", "local", "all_gather", "all_to_all".
std::string to_string(ReshardKind kind);

/// One rank's part of a reshard.
///
/// Every element a rank needs and does not hold comes from exactly one other rank, never from itself: in an
/// all_gather, the member of its group that holds it; in an all_to_all-v, one of its holders (the replicas of a
/// source block take turns, in rank order, over the ranks that need part of it). A rank thus receives the fewest
/// elements possible: its target block minus what it already holds.
///
/// Staging (besides the result): receiving needs at most one target block; sending at most one source block, even
/// or uneven: the pieces for different target blocks are disjoint parts of the source block, and a piece that
/// several ranks need (the target replicates it) is packed once and read by all of them (overlapping send
/// displacements of one all_to_all-v).
struct ReshardPlan {
  ReshardKind kind = ReshardKind::kKeep;
  /// kAllGather: the mesh axes (in mesh order) whose communicator runs it (all of them: the mesh communicator).
  std::vector<std::string> gather_axes;
  /// Mesh ranks of the collective's members in member order (the mesh's ranks for kAllToAll; the group along
  /// gather_axes for kAllGather; empty otherwise).
  std::vector<int> members;
  /// The block this rank holds before and after.
  Box source, target;
  /// The part of the target block copied from this rank's own source block (empty box sizes when none).
  Box self;
  /// Per member: the box this rank sends it / receives from it (zero-size for none and for this rank itself).
  /// kAllGather sends the whole source block to every other member.
  std::vector<Box> send, recv;
  /// Element counts handed to the collective, per member (for kAllGather, `recv_counts` is the allgatherv count
  /// array, the member's whole block, this rank's own included: MPI copies that one locally).
  std::vector<std::int64_t> send_counts, recv_counts;
  /// Elements of the staging buffers the executor allocates besides the result: packed sends and received data
  /// to unpack. Zero when the pieces already lie consecutively in the source block (send) or target block (recv).
  std::int64_t send_staging = 0, recv_staging = 0;
  /// kAllToAll: where the piece for each member starts in the send buffer (the staging buffer, or the consecutive run
  /// of the source block); members that get the same piece share its one copy.
  std::vector<std::int64_t> send_displs;

  /// Collectives issued: 0 or 1.
  int collectives() const noexcept { return kind == ReshardKind::kAllGather || kind == ReshardKind::kAllToAll ? 1 : 0; }
  /// Elements this rank sends to other ranks (a kAllGather block counts once per receiving member).
  std::int64_t elements_sent() const noexcept;
  /// Elements this rank receives from other ranks.
  std::int64_t elements_received() const noexcept;
};

/// The plan of `reshard` from `from` to `to` for an array of shape `global`, as seen by mesh rank `rank`. Every
/// rank derives the same kind and collective. Works on abstract meshes.
/// @throws InvalidArgument when the shardings are on different meshes, do not fit `global`, or `rank` is outside
///         the mesh.
ReshardPlan plan_reshard(const Shape& global, const NamedSharding& from, const NamedSharding& to, int rank);

}  // namespace shardkit
