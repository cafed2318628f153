#pragma once

// How far this rank's wall clock is from rank 0's, measured by ping-pongs (for SHARDKIT_TRACE: the merged timeline
// puts every rank's spans on rank 0's clock).

#include <cstdint>

#include "shardkit/launch/mpi.hpp"

namespace shardkit {

/// This rank's wall clock against rank 0's: rank 0's time = this rank's time - offset_us.
struct ClockOffset {
  std::int64_t offset_us = 0;  ///< this rank's clock minus rank 0's (0 on rank 0)
  std::int64_t rtt_us = 0;     ///< round trip of the sample it came from: the offset is known to within rtt_us / 2
  int rounds = 0;              ///< ping-pongs per rank (0: not measured)
};

/// Wall-clock nanoseconds and microseconds since the epoch (the clock the offsets are of).
std::int64_t wall_clock_ns() noexcept;
std::int64_t wall_clock_us() noexcept;
/// The same clock read at the kernel's tick (CLOCK_REALTIME_COARSE: a few milliseconds' resolution, never ahead of
/// wall_clock_us) for a fifth of the cost: the flight recorder's per-operation times, which answer "since when" in
/// seconds, on the hot path of every operation.
std::int64_t coarse_wall_clock_us() noexcept;

/// Measures every rank's offset against rank 0 of `comm`: rank 0 exchanges `rounds` ping-pongs with each rank in turn
/// (it sends, the rank answers with its clock) and keeps the sample with the shortest round trip, assuming the answer
/// was read halfway through it (Cristian's method); then tells each rank its result. Collective over `comm`; blocking
/// MPI point-to-point calls on it, with a tag no other shardkit traffic uses there.
ClockOffset measure_clock_offset(MpiCommHandle comm, int rounds = 8);

}  // namespace shardkit
