#include "shardkit/core/clock.hpp"

#include <time.h>

#include <chrono>

namespace shardkit {

std::int64_t wall_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::int64_t wall_clock_us() noexcept { return wall_clock_ns() / 1000; }

std::int64_t coarse_wall_clock_us() noexcept {
#ifdef CLOCK_REALTIME_COARSE
  timespec ts{};
  if (clock_gettime(CLOCK_REALTIME_COARSE, &ts) == 0) return std::int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
#endif
  return wall_clock_us();
}

}  // namespace shardkit
