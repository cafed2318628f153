#pragma once

// The wall clock every rank stamps its records with (the flight recorder, traces, hang warnings), and how far a
// rank's clock is from rank 0's (measured by the launch layer at start-up: measure_clock_offset).

#include <cstdint>

namespace shardkit {

/// Wall-clock nanoseconds and microseconds since the epoch (the clock the offsets are of).
std::int64_t wall_clock_ns() noexcept;
std::int64_t wall_clock_us() noexcept;
/// The same clock read at the kernel's tick (CLOCK_REALTIME_COARSE: a few milliseconds' resolution, never ahead of
/// wall_clock_us) for a fifth of the cost: the flight recorder's per-operation times, which answer "since when" in
/// seconds, on the hot path of every operation.
std::int64_t coarse_wall_clock_us() noexcept;

/// This rank's wall clock against rank 0's: rank 0's time = this rank's time - offset_us.
struct ClockOffset {
  std::int64_t offset_us = 0;  ///< this rank's clock minus rank 0's (0 on rank 0)
  std::int64_t rtt_us = 0;     ///< round trip of the sample it came from: the offset is known to within rtt_us / 2
  int rounds = 0;              ///< ping-pongs per rank (0: not measured)
};

}  // namespace shardkit
