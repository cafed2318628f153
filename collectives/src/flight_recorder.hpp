#pragma once

// The flight recorder: every communicator keeps a ring of its last operations (SHARDKIT_TRACE_BUFFER of them, 0: off)
// with what identifies each across ranks (collective sequence number, operation, dtype, count, root or peer, and what
// checked mode compares: the count and reduction every rank agrees on), its backend, its state and when it started, and
// where it was called from (the Python binding sets the call site). On a timeout, a mismatch or an abort each rank
// writes the rings of all its communicators as JSON to SHARDKIT_DUMP_DIR (rank<R>.json, with the job's identity, each
// communicator's agreed identity and how many collectives it has started), which `shardkit-trace analyze` reads.
// Recording costs a slot write and a clock read.
//
// An operation that returns a pending token is recorded as pending; whoever completes it (the thread that waits for
// or tests its token, or drops its last reference) records the completion in its entry, through the token itself
// (observe()): a dump, written by any thread, reads what the entries say and never touches a token. Nothing under a
// ring's lock or the registry's lock can block, complete an operation or take another lock: the lock is held for
// copies only (an entry's completion is a shared atomic, released after the lock).
//
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
#include "shardkit/collectives/options.hpp"
#include "shardkit/collectives/token.hpp"
#include "shardkit/core/dtype.hpp"
#include "shardkit/core/json.hpp"

namespace shardkit::detail {

/// kStarted: the calling thread is inside it; kPending: it returned a pending token whose completion nobody has seen.
enum class OpState : std::uint8_t { kStarted, kPending, kCompleted, kFailed };

/// When a pending operation completed, as the thread that completed it saw: 0 not yet, > 0 completed at (wall-clock
/// ns), < 0 failed at (negated).
using Completion = std::atomic<std::int64_t>;

/// What identifies an operation across ranks, as the pipeline describes it to the recorder.
struct OpRecord {
  OpKind op{};
  std::int64_t seq = -1;    ///< the collective sequence number; -1 for point-to-point
  DType dtype{};            ///< this rank's buffer's
  std::int64_t count = -1;  ///< elements this rank sends (or receives, when it sends none); -1: no buffer here
  int peer = -1;            ///< root, destination or source; -1 when none
  int source = -1;          ///< a sendrecv's source (its peer is its destination); -1 otherwise
  int reduce = -1;          ///< ReduceOp of a reduction; -1: none
  /// What every rank of a collective agrees on (checked mode's signature): its count and extra (v-operations' counts).
  std::int64_t agreed_count = -1;
  std::uint64_t agreed_extra = 0;
  BackendKind backend{};
  /// Its transport completes operations in issue order on the device (Transport::stream_ordered): a pending one is the
  /// device's, and one seen complete completes those before it.
  bool stream_ordered = false;
};

struct FlightEntry {
  std::uint64_t id = 0;  ///< operations recorded on this communicator before this one
  OpRecord what;
  OpState state = OpState::kStarted;
  std::int64_t start_us = 0;  ///< wall clock (microseconds since the epoch) at the tick: coarse_wall_clock_us
  std::int64_t end_us = 0;    ///< when it failed (0: did not, or not yet)
  CallSite site;
  std::shared_ptr<Completion> done;  ///< kPending: where its completion is recorded
};

/// One operation of the trace (SHARDKIT_TRACE): what the ring records of it, the communicator's track, and its times
/// in wall-clock nanoseconds.
struct TraceSpan {
  FlightEntry entry;
  int track = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;  ///< when the call returned (or raised)
};

/// An operation in progress, as the pipeline holds it between start and finish (or fail).
struct Recording {
  FlightEntry* slot = nullptr;      ///< its ring slot (nullptr: ring off)
  std::unique_ptr<TraceSpan> span;  ///< its span (nullptr: not tracing; two pointers keep the untraced path cheap)
  std::shared_ptr<Completion> done;  ///< set by observe() for a pending token
  std::uint64_t id = 0;              ///< the slot's entry: a slot another operation took since is left alone
};

class FlightRecorder : public std::enable_shared_from_this<FlightRecorder> {
 public:
  /// A recorder for communicator `name`, registered for the dumps while it lives.
  static std::shared_ptr<FlightRecorder> make(std::string name, int rank, int size, std::vector<int> world_ranks,
                                              std::size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// Records an operation as started (ring slot and, when tracing, the start of its span).
  Recording start(const OpRecord& what);
  /// The backend returned `t`: when it is pending and the operation is recorded (ring or trace), `t` wrapped so that
  /// whoever completes it records when (in the entry and the span). `completes_when_dropped`: dropping the last
  /// reference completes it (a pending MPI operation waits), so the wrapper does that itself and records how it ended.
  static Token observe(Recording& r, Token t, bool completes_when_dropped);
  /// The operation returned: completed, or (observe() saw a pending token) pending. Ends `r`.
  void finish(Recording& r);
  /// The operation raised (nothing when `r` was finished). Ends `r`.
  void fail(Recording& r) noexcept {
    if (r.slot || r.span) record_failure(r);
  }
  /// The communicator's identity, which every member agreed on (CommunicatorImpl::control): set once known.
  void set_id(std::int64_t id) noexcept { id_.store(id, std::memory_order_relaxed); }
  /// This communicator as a JSON object (name, agreed id, rank, size, world ranks, collectives started, operations
  /// oldest first). Reads entries only: any thread.
  std::string json();
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
  FlightRecorder(std::string name, int rank, int size, std::vector<int> world_ranks, std::size_t capacity);
  void record_failure(Recording& r) noexcept;
  void lock() noexcept;
  void unlock() noexcept { busy_.clear(std::memory_order_release); }
  // The entries oldest first, and the collectives started, copied under the lock.
  std::vector<FlightEntry> snapshot(std::int64_t* collectives);

  std::string name_;
  int track_ = -1;  // this communicator's track in the trace (-1: not tracing)
  int rank_, size_;
  std::vector<int> world_;
  std::atomic<std::int64_t> id_{-1};
  std::vector<FlightEntry> ring_;
  std::uint64_t next_ = 0;
  std::size_t next_slot_ = 0;  // next_ % ring_.size()
  std::int64_t collectives_ = 0;  // the highest sequence number started (+1): a ring may no longer reach them
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;  // the owner's writes against a dump from another thread
};

/// While it lives, the operation this thread is inside: the pipeline's recording, or a pending operation's wait. A
/// failure raised inside it calls fail_current_operation() first, so that the dump written before the raise says
/// "failed", not "started".
class InOperation {
 public:
  InOperation(FlightRecorder* recorder, Recording* recording) noexcept;
  explicit InOperation(Completion* done) noexcept;
  ~InOperation();
  InOperation(const InOperation&) = delete;
  InOperation& operator=(const InOperation&) = delete;

 private:
  FlightRecorder* recorder_;
  Recording* recording_;
  Completion* done_;
};
/// Records the operation this thread is inside (InOperation) as failed, now: a timeout or a mismatch is about to be
/// raised from it, after a dump. Nothing when there is none.
void fail_current_operation() noexcept;

/// The state an entry shows: a pending one as its completion says.
OpState effective_state(const FlightEntry& e) noexcept;

/// Writes every live recorder of this process to <dump dir>/rank<world rank>.json with `reason` (at most once per
/// reason; never throws). Returns the file written ("" when none). A dump this process decided on (`local`) asks
/// every other rank's watchdog to write its own (watchdog.hpp); one another rank asked for does not ask again.
/// `unless_recent`: none when this process wrote one less than kRecentDumpUs ago, decided under the lock the dumps take
/// (a dump another rank asks for while this rank writes its own would otherwise overwrite it).
std::string dump_flight_records(const std::string& reason, bool local = true, bool unless_recent = false) noexcept;
/// How recent a dump makes another unnecessary (unless_recent, and the watchdog's answer to another rank's request).
inline constexpr std::int64_t kRecentDumpUs = 2000000;
/// The directory dumps go to: SHARDKIT_DUMP_DIR, else "shardkit-dump-<job>" in the working directory (the launcher's
/// job id, or the job identity every rank agreed on at start: never a name an earlier job used).
std::string flight_dump_dir();
/// This process's rank in MPI_COMM_WORLD, as the recorders know it (-1 before the first); no MPI call.
int flight_world_rank() noexcept;
/// Waits, up to SHARDKIT_DUMP_WAIT_S, until the dump directory holds a dump of this job (its identity, not only a
/// file of that name: a directory an earlier job left does not count) of each of `size` ranks (before the job ends:
/// ending it kills ranks that are about to write theirs).
void wait_for_dumps(int size);
/// When this process last wrote a dump (microseconds since the epoch; 0: never).
std::int64_t flight_last_dump_us() noexcept;
/// The job's identity as the recorders know it (Runtime::job_id, set by the first recorder; 0: unknown).
std::uint64_t flight_job_id() noexcept;
/// Every live recorder of this process, taken under the registry's lock (and used after it).
std::vector<std::shared_ptr<FlightRecorder>> live_flight_recorders();
/// Before the job ends (MPI_Abort): this rank's dump, then up to SHARDKIT_DUMP_WAIT_S (default 2 s) for the other
/// ranks' to appear, since ending the job kills ranks that are about to write theirs (flight_dump.cpp).
void dump_before_abort(const std::string& reason);
/// Every live recorder's activity (FlightRecorder::activity).
std::vector<FlightRecorder::Activity> flight_activities(bool waiting);

/// Ends the job at exit (request_abort_at_exit) after writing the flight records: every timeout and abort path.
void end_job_at_exit(const std::string& reason);

}  // namespace shardkit::detail
