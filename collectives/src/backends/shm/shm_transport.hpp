#pragma once

// The shm transport's descriptor (transport.hpp) and the rules it routes by: its operations, on host buffers of the
// ranks of one node (flat) or of several (hierarchical, hierarchy.hpp), where measured faster than MPI or forced.

#include <cstdint>

#include "transport.hpp"

namespace shardkit::detail {

const Transport& shm_transport() noexcept;

/// Its traits (TransportView::traits, Backend::route_traits): the backend spans nodes; its ranks outnumber their CPUs.
inline constexpr std::uint32_t kShmHierarchical = 1;
inline constexpr std::uint32_t kShmCrowded = 2;

/// The default route's table: where shm was measured faster than MPI (see docs/shm.md), for ranks that outnumber their
/// CPUs (`crowded`) or not.
bool shm_by_default(OpKind op, std::int64_t bytes, bool crowded = false) noexcept;
/// The default route's table for a communicator spanning nodes: where the hierarchical path was measured faster than
/// flat MPI (see docs/shm.md).
bool hier_by_default(OpKind op, std::int64_t bytes) noexcept;

}  // namespace shardkit::detail
