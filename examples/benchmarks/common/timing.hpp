#pragma once

// Timing shared by the benchmarks: one measurement is a barrier, the timed work, and the slowest rank's time (as
// nccl-tests reports it); repeats are summarised by their min and median.

#include <mpi.h>

#include <vector>

#include "shardkit/launch/mpi.hpp"

namespace shardkit::bench {

/// Seconds on a monotonic clock.
double now();

/// The largest of every rank's `seconds` on `control`.
double slowest_rank(double seconds, MPI_Comm control);

/// Seconds `fn` takes on the slowest rank, started together after a barrier on `control` (a communicator the
/// measured code does not use, so that it sees no extra traffic).
template <typename Fn>
double time_slowest(MPI_Comm control, Fn&& fn) {
  SHARDKIT_MPI_CHECK(MPI_Barrier(control));
  const double t0 = now();
  fn();
  return slowest_rank(now() - t0, control);
}

/// The median of `v` (the mean of the middle two for an even count); `v` must not be empty.
double median(std::vector<double> v);

/// Min and median of repeated measurements.
struct Stats {
  double min = 0;
  double median = 0;
};

/// Min and median of `values`, scaled by `scale` (1e6: seconds to microseconds); `values` must not be empty.
Stats stats(const std::vector<double>& values, double scale = 1.0);

}  // namespace shardkit::bench
