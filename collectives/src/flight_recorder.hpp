#pragma once

// The flight recorder: every communicator keeps a ring of its last operations (SHARDKIT_TRACE_BUFFER of them, 0: off)
// with what identifies each across ranks (collective sequence number, operation, dtype, count, root or peer), its
// backend, its state and when it started, and where it was called from (the Python binding sets the call site). On a
// timeout, a mismatch or an abort each rank writes the rings of all its communicators as JSON to SHARDKIT_DUMP_DIR
// (rank<R>.json), which `shardkit-trace analyze` reads. Recording costs a slot write and a clock read.
// With SHARDKIT_TRACE every operation also becomes a span of the rank's trace (trace_writer.hpp); without it, the
// trace costs a branch.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/collectives/call_site.hpp"
#include "shardkit/collectives/ops.hpp"
#include "shardkit/collectives/token.hpp"
#include "shardkit/core/dtype.hpp"
#include "shardkit/core/json.hpp"
#include "shardkit/launch/config.hpp"

namespace shardkit::detail {

enum class OpState : std::uint8_t { kStarted, kCompleted, kFailed };

struct FlightEntry {
  std::uint64_t id = 0;  ///< operations recorded on this communicator before this one
  std::int64_t seq = -1;  ///< the collective sequence number; -1 for point-to-point
  OpKind op{};
  DType dtype{};
  std::int64_t count = -1;  ///< elements this rank sends (or receives, when it sends none); -1: no buffer here
  int peer = -1;           ///< root, destination or source; -1 when none
  BackendKind backend{};
  OpState state = OpState::kStarted;
  std::int64_t start_us = 0;  ///< wall clock (microseconds since the epoch) at the tick: coarse_wall_clock_us
  std::int64_t end_us = 0;    ///< when it failed (0: did not, or not yet)
  CallSite site;
  std::shared_ptr<Waitable> pending;  ///< a pending token's completion, read when dumping
};

/// One operation of the trace (SHARDKIT_TRACE): what the ring records of it (without `pending`), the communicator's
/// track, and its times in wall-clock nanoseconds.
struct TraceSpan {
  FlightEntry entry;
  int track = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;  ///< when the call returned (or raised)
  /// A pending token's completion as first seen through the token (wait, is_complete); 0: not seen (yet); negated
  /// when it failed.
  std::shared_ptr<std::atomic<std::int64_t>> completed_ns;
};

/// An operation in progress, as the pipeline holds it between start and finish (or fail).
struct Recording {
  FlightEntry* slot = nullptr;      ///< its ring slot (nullptr: ring off)
  std::unique_ptr<TraceSpan> span;  ///< its span (nullptr: not tracing; two pointers keep the untraced path cheap)
};

class FlightRecorder {
 public:
  FlightRecorder(std::string name, int rank, int size, std::vector<int> world_ranks, std::size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// Records an operation as started (ring slot and, when tracing, the start of its span).
  Recording start(OpKind op, std::int64_t seq, DType dtype, std::int64_t count, int peer, BackendKind backend);
  /// The backend returned `t` for a traced operation: when `t` is pending, `t` wrapped so that its completion ends the
  /// span.
  static Token traced(Recording& r, Token t);
  /// The operation returned `t`: completed, or pending on its waitable. Ends `r`.
  void finish(Recording& r, const Token& t);
  /// The operation raised (nothing when `r` was finished). Ends `r`.
  void fail(Recording& r) noexcept {
    if (r.slot || r.span) record_failure(r);
  }
  /// This communicator as a JSON object (name, rank, size, world ranks, operations oldest first). With
  /// `ask_pending`, pending tokens are asked whether they completed (which may call MPI: not from the watchdog).
  std::string json(bool ask_pending = true);
  /// What this communicator is doing: its oldest operation still in progress (a blocking one, or, while some thread
  /// of the process waits, one pending on a token), and its newest one. Empty descriptions when there is none.
  struct Activity {
    std::int64_t busy_since_us = 0;  ///< 0: nothing in progress
    std::string busy, last;          ///< "allreduce #5 (4 x float64) on communicator 'world' at train.py:42"
    std::int64_t last_start_us = 0;
  };
  Activity activity(bool waiting);
  std::size_t capacity() const noexcept { return ring_.size(); }

 private:
  void record_failure(Recording& r) noexcept;
  void lock() noexcept;
  void unlock() noexcept { busy_.clear(std::memory_order_release); }

  std::string name_;
  int track_ = -1;  // this communicator's track in the trace (-1: not tracing)
  int rank_, size_;
  std::vector<int> world_;
  std::vector<FlightEntry> ring_;
  std::uint64_t next_ = 0;
  std::size_t next_slot_ = 0;  // next_ % ring_.size()
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;  // the owner's writes against a dump from another thread
};


/// Writes every live recorder of this process to <dump dir>/rank<world rank>.json with `reason` (at most once per
/// reason; never throws). Returns the file written ("" when none). A dump this process decided on (`local`) asks
/// every other rank's watchdog to write its own (watchdog.hpp); one another rank asked for does not ask again, and
/// leaves pending tokens unasked (it runs on the watchdog's thread, which never calls MPI). `unless_recent`: none
/// when this process wrote one less than kRecentDumpUs ago, decided under the lock the dumps take (a dump another rank
/// asks for while this rank writes its own would otherwise overwrite it, with its pending tokens unasked).
std::string dump_flight_records(const std::string& reason, bool local = true, bool unless_recent = false) noexcept;
/// How recent a dump makes another unnecessary (unless_recent, and the watchdog's answer to another rank's request).
inline constexpr std::int64_t kRecentDumpUs = 2000000;
/// The directory dumps go to: SHARDKIT_DUMP_DIR, else "shardkit-dump-<job id>" in the working directory.
std::string flight_dump_dir();
/// This process's rank in MPI_COMM_WORLD, as the recorders know it (-1 before the first); no MPI call.
int flight_world_rank() noexcept;
/// Waits, up to SHARDKIT_DUMP_WAIT_S, until the dump directory holds a dump of each of `size` ranks (before the job
/// ends: ending it kills ranks that are about to write theirs).
void wait_for_dumps(int size);
/// When this process last wrote a dump (microseconds since the epoch; 0: never).
std::int64_t flight_last_dump_us() noexcept;
/// Every live recorder's activity (FlightRecorder::activity).
std::vector<FlightRecorder::Activity> flight_activities(bool waiting);

/// Ends the job at exit (request_abort_at_exit) after writing the flight records: every timeout and abort path.
void end_job_at_exit(const std::string& reason);

}  // namespace shardkit::detail
