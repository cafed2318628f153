#include "shardkit/launch/clock_sync.hpp"

#include <mpi.h>

#include <chrono>
#include <limits>

#include "shardkit/core/error.hpp"

namespace shardkit {

namespace {
constexpr int kTag = 0x5c10;  // the Runtime's world duplicate carries no other point-to-point traffic when this runs
}  // namespace

ClockOffset measure_clock_offset(MpiCommHandle handle, int rounds) {
  MPI_Comm comm = to_mpi<MPI_Comm>(handle);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(comm, &size));
  ClockOffset mine;
  mine.rounds = rounds;
  std::int64_t result[2] = {0, 0};  // offset, round trip (ns)
  if (rank == 0) {
    for (int peer = 1; peer < size; ++peer) {
      std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max(), best_offset = 0;
      for (int i = 0; i < rounds; ++i) {
        std::int64_t theirs = 0;
        const std::int64_t t0 = wall_clock_ns();
        SHARDKIT_MPI_CHECK(MPI_Send(&t0, 1, MPI_INT64_T, peer, kTag, comm));
        SHARDKIT_MPI_CHECK(MPI_Recv(&theirs, 1, MPI_INT64_T, peer, kTag, comm, MPI_STATUS_IGNORE));
        const std::int64_t t1 = wall_clock_ns();
        if (t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          best_offset = theirs - (t0 + (t1 - t0) / 2);
        }
      }
      result[0] = best_offset;
      result[1] = best_rtt;
      SHARDKIT_MPI_CHECK(MPI_Send(result, 2, MPI_INT64_T, peer, kTag, comm));
    }
    result[0] = result[1] = 0;
  } else {
    for (int i = 0; i < rounds; ++i) {
      std::int64_t ping = 0;
      SHARDKIT_MPI_CHECK(MPI_Recv(&ping, 1, MPI_INT64_T, 0, kTag, comm, MPI_STATUS_IGNORE));
      const std::int64_t now = wall_clock_ns();
      SHARDKIT_MPI_CHECK(MPI_Send(&now, 1, MPI_INT64_T, 0, kTag, comm));
    }
    SHARDKIT_MPI_CHECK(MPI_Recv(result, 2, MPI_INT64_T, 0, kTag, comm, MPI_STATUS_IGNORE));
  }
  // Rounded to the nearest microsecond (the traces' unit).
  mine.offset_us = result[0] >= 0 ? (result[0] + 500) / 1000 : -((-result[0] + 500) / 1000);
  mine.rtt_us = (result[1] + 999) / 1000;
  return mine;
}

}  // namespace shardkit
