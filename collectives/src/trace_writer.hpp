#pragma once

// The per-rank trace (SHARDKIT_TRACE=DIR): every operation of every communicator as one Chrome-trace "X" event (a
// span; Perfetto and chrome://tracing read the file) in DIR/rank<R>.trace.json. The file's "otherData" holds the
// rank, its host, the wall-clock origin of its timestamps and its clock's offset to rank 0's (measured by the
// Runtime at start-up), which `shardkit-trace merge` applies. One track (pid) per rank, one thread (tid) per
// communicator.
//
// Spans are kept in memory in chunks of kTraceChunk operations and appended to the file when a chunk fills, when an
// operation ends more than kTraceFlushNs after the last write (so a rank killed by another's MPI_Abort loses about a
// second of spans at most), at exit (atexit), and whenever the flight recorder dumps (timeout, mismatch, abort).
// After every write the file ends with the closing "]}", so it is valid JSON even when the process is killed later;
// the next write overwrites that end.

#include <cstddef>
#include <cstdint>
#include <string>

#include "flight_recorder.hpp"

namespace shardkit::detail {

/// Operations held in memory before they are written.
inline constexpr std::size_t kTraceChunk = 4096;
/// The longest a finished operation waits in memory, when more operations come.
inline constexpr std::int64_t kTraceFlushNs = 1'000'000'000;

/// Opens this rank's trace on first use (SHARDKIT_TRACE must be set) and returns a new track for communicator
/// `name`; -1 when the file cannot be written (said once on stderr; the job goes on without a trace).
int trace_track(const std::string& name);
/// Adds a finished operation (never throws; a failed write is said once on stderr).
void trace_span(TraceSpan&& span) noexcept;
/// Writes every held span and the file's end. Returns the file ("" when not tracing).
std::string flush_trace() noexcept;

}  // namespace shardkit::detail
