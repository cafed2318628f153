#pragma once

// The watchdog: one thread per process, started with the first world communicator when the flight recorder is on.
// It needs no MPI once started, so it acts while the rank's own thread is blocked in MPI or busy in its own code:
//   - a dump that one rank decides on (a timeout, a mismatch, an abort, a hang warning, SIGUSR1) is sent as a UDP
//     datagram to every other rank's watchdog (addresses exchanged when it starts), which writes that rank's dump;
//     so the analyzer also sees the ranks that never entered the operation;
//   - SIGUSR1 makes the rank print what it is doing and write its dump, and asks the others to do the same;
//   - with SHARDKIT_HANG_WARN_S, an operation that has waited that long prints one line per rank (what each waits
//     for, and since when) and writes the dumps, once per operation; the job goes on.

#include <string>
#include <vector>

#include "shardkit/collectives/communicator.hpp"
#include "shardkit/launch/mpi.hpp"

namespace shardkit::detail {

struct AbortState;

/// Exchanges the watchdogs' addresses over `control` (every rank of MPI_COMM_WORLD, under `options.timeout`), then
/// starts this process's watchdog. Once per process (later calls return at once, and so do all calls when the flight
/// recorder is off: every rank decides alike). Collective over `control`.
/// @throws TimeoutError naming the ranks that did not arrive (the job ends at exit), or Interrupted.
void start_watchdog(MpiCommHandle control, const std::string& name, const CommOptions& options, AbortState& abort);

/// Tests: `hook` runs in start_watchdog just before its exchange (e.g. a rank that comes late to it).
void watchdog_before_exchange_for_tests(void (*hook)()) noexcept;

/// Asks every other rank's watchdog to write its dump, with `reason` (no MPI; never throws; nothing before
/// start_watchdog).
void request_dumps(const std::string& reason) noexcept;

/// One line for stderr: what this rank is doing now ("waiting 12 s for allreduce #5 on communicator 'world' at
/// train.py:42", or "in none of shardkit's operations; the last: ...").
std::string describe_activity();

}  // namespace shardkit::detail
