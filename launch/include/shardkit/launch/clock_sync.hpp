#pragma once

// How far this rank's wall clock is from rank 0's, measured by ping-pongs (for SHARDKIT_TRACE: the merged timeline
// puts every rank's spans on rank 0's clock).

#include <cstdint>

#include "shardkit/core/clock.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit {

/// Measures every rank's offset against rank 0 of `comm`: rank 0 exchanges `rounds` ping-pongs with each rank in turn
/// (it sends, the rank answers with its clock) and keeps the sample with the shortest round trip, assuming the answer
/// was read halfway through it (Cristian's method); then tells each rank its result. Collective over `comm`; blocking
/// MPI point-to-point calls on it, with a tag no other shardkit traffic uses there.
ClockOffset measure_clock_offset(MpiCommHandle comm, int rounds = 8);

}  // namespace shardkit
