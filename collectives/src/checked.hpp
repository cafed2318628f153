#pragma once

// Checked mode (SHARDKIT_CHECK=1): before a collective, every rank sends a small signature of what it is about to do
// to every other rank over the control communicator, and compares. Disagreement raises MismatchError on every rank
// (naming the fields and the ranks), before any data moves, so the communicator stays usable. A rank that does not
// arrive in time is named in a TimeoutError.

#include <cstdint>
#include <span>

#include "backend.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

/// Signature::op of a communicator's creation (split, dup), which ranks agree on before creating it.
inline constexpr std::uint32_t kCreationOp = 0xC0;

struct Signature {
  std::uint64_t seq = 0;
  std::uint32_t op = 0;
  std::int32_t dtype = -1;    ///< -1: none
  std::int64_t count = -1;    ///< -1: none
  std::int32_t root = -1;     ///< -1: none
  std::int32_t reduce = -1;   ///< -1: none
  std::int32_t backend = -1;  ///< BackendKind
  std::int32_t pad = 0;
  std::uint64_t extra = 0;    ///< e.g. a hash of per-rank counts
};

/// Exchanges `mine` with every rank of `control` and compares.
/// @throws MismatchError when any field differs between ranks (on every rank alike);
///         TimeoutError naming the missing ranks when some do not arrive before ctx.deadline.
void check_signatures(MpiCommHandle control, const Signature& mine, const OpContext& ctx, AbortState& abort);

/// Checked mode for alltoallv: rank j must expect from rank i exactly what i sends to j.
/// @throws MismatchError on every rank when any pair disagrees.
void check_alltoallv_counts(MpiCommHandle control, std::span<const std::int64_t> send_counts,
                            std::span<const std::int64_t> recv_counts, const OpContext& ctx, AbortState& abort);

/// FNV-1a hash of a count array (for v-operation signatures).
std::uint64_t hash_counts(std::span<const std::int64_t> counts) noexcept;

}  // namespace shardkit::detail
