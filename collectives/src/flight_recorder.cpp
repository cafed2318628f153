// The flight recorder (flight_recorder.hpp): rings per communicator and the process's registry of them. Their dumps:
// flight_dump.cpp.

#include "flight_recorder.hpp"

#include <atomic>
#include <mutex>
#include <thread>

#include "shardkit/core/clock.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"
#include "trace_writer.hpp"
#include "transport.hpp"

namespace shardkit::detail {
namespace {

// Every recorder, for the dumps: weak references, dropped once expired. The lock is held only to copy them.
std::mutex registry_mu;
std::vector<std::weak_ptr<FlightRecorder>>& registry() {
  static auto* r =
      new std::vector<std::weak_ptr<FlightRecorder>>();  // never freed: dumps may run at static destruction
  return *r;
}

const char* state_name(OpState s) {
  switch (s) {
    case OpState::kStarted: return "started";
    case OpState::kPending:
      return "pending";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "?";
}

std::atomic<int> g_world_rank{-1};  // set by the first recorder: the dump never calls MPI for it
std::atomic<std::uint64_t> g_job{0};  // the job's identity (JobInfo::id), set by the first recorder; 0: unknown

// "allreduce #5 (4 x float64) peer/root 0": the operation as every message names it (the dumps carry it as "what",
// which `shardkit-trace analyze` prints).
std::string what_text(const OpRecord& w) {
  std::string s = op_name(w.op);
  if (w.seq >= 0) s += concat(" #", w.seq);
  if (w.count >= 0) s += concat(" (", w.count, " x ", dtype_name(w.dtype), ")");
  if (w.peer >= 0) s += concat(" peer/root ", w.peer);
  return s;
}

std::string describe(const FlightEntry& e, const std::string& comm) {
  std::string s = what_text(e.what) + concat(" on communicator '", comm, "'");
  if (e.site.file) s += concat(" at ", e.site.file, ":", e.site.line);
  return s;
}

}  // namespace

namespace {

// The operation this thread is inside (InOperation).
struct Current {
  FlightRecorder* recorder = nullptr;
  Recording* recording = nullptr;
  Completion* done = nullptr;
};
thread_local Current g_current;

void note_completion(Completion& done, bool failed) noexcept {  // the first sighting only
  std::int64_t none = 0;
  const std::int64_t now = wall_clock_ns();
  done.compare_exchange_strong(none, failed ? -now : now, std::memory_order_acq_rel);
}

}  // namespace

InOperation::InOperation(FlightRecorder* recorder, Recording* recording) noexcept
    : recorder_(g_current.recorder), recording_(g_current.recording), done_(g_current.done) {
  g_current = {recorder, recording, nullptr};
}

InOperation::InOperation(Completion* done) noexcept
    : recorder_(g_current.recorder), recording_(g_current.recording), done_(g_current.done) {
  g_current = {nullptr, nullptr, done};
}

InOperation::~InOperation() {
  g_current = {recorder_, recording_, done_};
}

void fail_current_operation() noexcept {
  if (g_current.recorder && g_current.recording) g_current.recorder->fail(*g_current.recording);
  if (g_current.done) note_completion(*g_current.done, true);
}

namespace {

// A pending token's waitable that records its operation's completion where it happens: whoever waits for it, tests
// it or (for a pending MPI operation, which completes when dropped) drops its last reference notes the time, once.
class Observed final : public Waitable {
 public:
  Observed(std::shared_ptr<Waitable> inner, std::shared_ptr<Completion> done, OpKind op, bool completes_when_dropped)
      : inner_(std::move(inner)), done_(std::move(done)), op_(op), completes_when_dropped_(completes_when_dropped) {}
  ~Observed() override {
    if (!completes_when_dropped_ || done_->load(std::memory_order_acquire) != 0) return;
    // As the pending operation's own destructor would: completed (its buffers stay MPI's until then), errors logged.
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "shardkit: warning: pending %s failed: %s\n", op_name(op_), e.what());
    }
  }
  void wait() override {
    try {
      const InOperation inside(done_.get());
      inner_->wait();
    } catch (...) {
      note(true);
      throw;
    }
    note(false);
  }
  bool is_complete() override {
    try {
      if (!inner_->is_complete()) return false;
    } catch (...) {
      note(true);
      throw;
    }
    note(false);
    return true;
  }
  void enqueue_wait(StreamHandle stream) override { inner_->enqueue_wait(stream); }  // the device sees it, not us

 private:
  void note(bool failed) noexcept { note_completion(*done_, failed); }
  std::shared_ptr<Waitable> inner_;
  std::shared_ptr<Completion> done_;
  OpKind op_;
  bool completes_when_dropped_;
};

}  // namespace

OpState effective_state(const FlightEntry& e) noexcept {
  if (e.state != OpState::kPending || !e.done) return e.state;
  const std::int64_t at = e.done->load(std::memory_order_acquire);
  return at == 0 ? OpState::kPending : at > 0 ? OpState::kCompleted : OpState::kFailed;
}

std::shared_ptr<FlightRecorder> FlightRecorder::make(std::string name, int rank, int size, std::vector<int> world_ranks,
                                                     std::size_t capacity) {
  std::shared_ptr<FlightRecorder> r(new FlightRecorder(std::move(name), rank, size, std::move(world_ranks), capacity));
  std::lock_guard lock(registry_mu);
  auto& reg = registry();
  std::erase_if(reg, [](const std::weak_ptr<FlightRecorder>& w) { return w.expired(); });
  reg.push_back(r);
  return r;
}

FlightRecorder::FlightRecorder(std::string name, int rank, int size, std::vector<int> world_ranks,
                               std::size_t capacity)
    : name_(std::move(name)), rank_(rank), size_(size), world_(std::move(world_ranks)), ring_(capacity) {
  if (!ProcessSettings::current().trace_dir.empty()) track_ = trace_track(name_);
  if (capacity || track_ >= 0) set_before_abort(&dump_before_abort);
  if (rank_ >= 0 && static_cast<std::size_t>(rank_) < world_.size()) g_world_rank.store(world_[rank_]);
  if (const JobInfo* job = JobInfo::current(); job && g_job.load() == 0) g_job.store(job->id);
}

// The registry holds weak references, dropped as they expire (make); nothing to do here, so that the last reference
// may go on any thread, a dump's included, without taking the registry's lock.
FlightRecorder::~FlightRecorder() = default;

void FlightRecorder::lock() noexcept {
  while (busy_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
}

Recording FlightRecorder::start(const OpRecord& what) {
  Recording r;
  if (track_ >= 0) {
    r.span = std::make_unique<TraceSpan>();
    r.span->entry.what = what;
    r.span->entry.site = current_call_site();
    r.span->track = track_;
    r.span->start_ns = wall_clock_ns();
  }
  if (ring_.empty() && !r.span) return r;
  std::shared_ptr<Completion> old;  // the overwritten entry's, released once the lock is
  lock();
  const std::uint64_t id = next_++;
  if (what.seq >= 0 && what.seq + 1 > collectives_) collectives_ = what.seq + 1;
  if (!ring_.empty()) {
    FlightEntry& e = ring_[next_slot_];  // id % capacity, without a division on every operation
    if (++next_slot_ == ring_.size()) next_slot_ = 0;
    e.id = id;
    e.what = what;
    e.state = OpState::kStarted;
    e.site = current_call_site();
    e.start_us = coarse_wall_clock_us();
    e.end_us = 0;
    old = std::move(e.done);
    r.slot = &e;
    r.id = id;
  }
  unlock();
  if (r.span) r.span->entry.id = id;
  return r;
}

Token FlightRecorder::observe(Recording& r, Token t, bool completes_when_dropped) {
  if ((!r.slot && !r.span) || !t.waitable()) return t;
  r.done = std::make_shared<Completion>(0);
  const OpKind op = r.span ? r.span->entry.what.op : r.slot->what.op;
  if (r.span) r.span->entry.done = r.done;
  return Token(std::make_shared<Observed>(t.waitable(), r.done, op, completes_when_dropped));
}

void FlightRecorder::finish(Recording& r) {
  if (r.span) {
    r.span->end_ns = wall_clock_ns();
    r.span->entry.state = r.done ? OpState::kPending : OpState::kCompleted;
    trace_span(std::move(*r.span));
    r.span.reset();
  }
  FlightEntry* e = std::exchange(r.slot, nullptr);
  if (!e) return;
  std::shared_ptr<Completion> done = std::move(r.done);
  lock();
  if (e->id != r.id) {
    // Another thread's operation took the slot meanwhile (two threads on one communicator: refused, but not always
    // seen): its entry stays its own.
  } else if (done) {
    e->state = OpState::kPending;
    e->done.swap(done);  // `done` now holds whatever the slot held (nothing): released after the lock
  } else {
    e->state = OpState::kCompleted;  // no second clock read: its cost would double the recorder's
  }
  unlock();
}

void FlightRecorder::record_failure(Recording& r) noexcept {
  const std::int64_t now_ns = wall_clock_ns();
  if (r.span) {
    r.span->end_ns = now_ns;
    r.span->entry.state = OpState::kFailed;
    trace_span(std::move(*r.span));
    r.span.reset();
  }
  r.done.reset();
  FlightEntry* e = std::exchange(r.slot, nullptr);
  if (!e) return;
  lock();
  if (e->id == r.id) {
    e->state = OpState::kFailed;
    e->end_us = now_ns / 1000;
  }
  unlock();
}

std::vector<FlightEntry> FlightRecorder::snapshot(std::int64_t* collectives) {
  std::vector<FlightEntry> ops;
  ops.reserve(ring_.size());  // allocated before the lock
  lock();
  const std::uint64_t n = std::min<std::uint64_t>(next_, ring_.size());
  for (std::uint64_t k = 0; k < n; ++k) ops.push_back(ring_[(next_ - n + k) % ring_.size()]);
  if (collectives) *collectives = collectives_;
  unlock();
  // A stream-ordered transport's operations complete in the order they were issued (NCCL: one stream): an earlier one
  // whose completion nobody saw (a token waited for on the device, or dropped) is complete once a later one's is seen.
  for (std::size_t k = ops.size(); k-- > 0;) {
    if (!ops[k].what.stream_ordered || effective_state(ops[k]) != OpState::kCompleted) continue;
    for (std::size_t i = 0; i < k; ++i)
      if (ops[i].what.backend == ops[k].what.backend && effective_state(ops[i]) == OpState::kPending) {
        ops[i].state = OpState::kCompleted;
        ops[i].done.reset();
      }
    break;
  }
  return ops;
}

FlightRecorder::Activity FlightRecorder::activity(bool waiting) {
  Activity a;
  const std::vector<FlightEntry> ops = snapshot(nullptr);
  for (const FlightEntry& e : ops) {
    const OpState s = effective_state(e);
    // A pending stream-ordered operation is the device's: no host thread waits for it (a hang there shows as a started
    // wait).
    if (s == OpState::kStarted || (s == OpState::kPending && waiting && !e.what.stream_ordered)) {
      a.busy_since_us = e.start_us;
      a.busy = describe(e, name_);
      break;
    }
  }
  if (!ops.empty()) {
    const FlightEntry& last = ops.back();
    a.last = describe(last, name_) + concat(" (", state_name(effective_state(last)), ")");
    a.last_start_us = last.start_us;
  }
  return a;
}

std::string FlightRecorder::json() {
  std::int64_t collectives = 0;
  const std::vector<FlightEntry> ops = snapshot(&collectives);
  std::string out = "{\"name\": ";
  append_json_string(out, name_);
  out += concat(", \"id\": ", id_.load(std::memory_order_relaxed), ", \"rank\": ", rank_, ", \"size\": ", size_,
                ", \"world_ranks\": [");
  for (std::size_t i = 0; i < world_.size(); ++i) out += concat(i ? ", " : "", world_[i]);
  out += concat("], \"capacity\": ", ring_.size(), ", \"collectives\": ", collectives, ", \"ops\": [");
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const FlightEntry& e = ops[k];
    const OpRecord& w = e.what;
    const OpState state = effective_state(e);
    std::int64_t end_us = e.end_us;
    if (e.state == OpState::kPending && e.done) {
      const std::int64_t at = e.done->load(std::memory_order_acquire);
      end_us = (at < 0 ? -at : at) / 1000;
    }
    char extra[24];
    std::snprintf(extra, sizeof extra, "%llx", static_cast<unsigned long long>(w.agreed_extra));
    out += concat(k ? ",\n    " : "\n    ", "{\"id\": ", e.id, ", \"seq\": ", w.seq, ", \"op\": \"", op_name(w.op),
                  "\", \"dtype\": ", w.count < 0 ? "null" : concat("\"", dtype_name(w.dtype), "\""),
                  ", \"count\": ", w.count, ", \"peer\": ", w.peer, ", \"source\": ", w.source, ", \"reduce\": ",
                  w.reduce < 0 ? "null" : concat("\"", reduce_op_name(static_cast<ReduceOp>(w.reduce)), "\""),
                  ", \"agreed_count\": ", w.agreed_count, ", \"agreed_extra\": \"", extra, "\", \"backend\": \"",
                  transport_name(w.backend), "\", \"state\": \"", state_name(state), "\", \"start_us\": ", e.start_us,
                  ", \"end_us\": ", end_us, ", \"what\": ");
    append_json_string(out, what_text(w));
    out += ", \"site\": ";
    if (e.site.file) {
      append_json_string(out, concat(e.site.file, ":", e.site.line));
    } else {
      out += "null";
    }
    out += "}";
  }
  out += "]}";
  return out;
}

int flight_world_rank() noexcept { return g_world_rank.load(); }
std::uint64_t flight_job_id() noexcept { return g_job.load(); }

std::vector<std::shared_ptr<FlightRecorder>> live_flight_recorders() {
  std::vector<std::shared_ptr<FlightRecorder>> out;
  std::lock_guard lock(registry_mu);
  for (const auto& w : registry())
    if (auto r = w.lock()) out.push_back(std::move(r));
  return out;
}

std::vector<FlightRecorder::Activity> flight_activities(bool waiting) {
  std::vector<FlightRecorder::Activity> out;
  for (const auto& r : live_flight_recorders())
    if (r->capacity()) out.push_back(r->activity(waiting));
  return out;
}

}  // namespace shardkit::detail
