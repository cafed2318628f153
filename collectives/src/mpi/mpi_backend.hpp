#pragma once

#include <cstdint>

namespace shardkit::detail {

/// Largest element count passed to one MPI call (INT_MAX by default: MPI-3 counts are int). Larger messages are
/// split into chunks, or sent as point-to-point pieces. Lowered by tests to exercise the split paths cheaply.
std::int64_t mpi_max_count() noexcept;
void set_mpi_max_count(std::int64_t count);

}  // namespace shardkit::detail
