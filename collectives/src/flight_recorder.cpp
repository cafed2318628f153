// The flight recorder (flight_recorder.hpp): rings per communicator, the process's registry of them, and the dump.

#include "flight_recorder.hpp"

#include "trace_writer.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "shardkit/core/error.hpp"
#include "shardkit/launch/clock_sync.hpp"
#include "shardkit/launch/mpi.hpp"
#include "shardkit/launch/runtime.hpp"
#include "watchdog.hpp"

namespace shardkit::detail {
namespace {

// Every live recorder, for the dump (they unregister when their communicator goes).
std::mutex registry_mu;
std::vector<FlightRecorder*>& registry() {
  static auto* r = new std::vector<FlightRecorder*>();  // never freed: a dump may run during static destruction
  return *r;
}

const char* state_name(OpState s) {
  switch (s) {
    case OpState::kStarted: return "started";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "?";
}

// Before the job ends (MPI_Abort): this rank's dump, then up to SHARDKIT_DUMP_WAIT_S (default 2 s) for the other
// ranks' to appear, since ending the job kills ranks that are about to write theirs (ranks waiting in the same
// operation time out moments apart).
void before_abort(const std::string& reason) {
  flush_trace();
  dump_flight_records(reason);
  int size = 1;
  if (mpi_initialized() && !mpi_finalized()) MPI_Comm_size(MPI_COMM_WORLD, &size);
  wait_for_dumps(size);
}

}  // namespace

void wait_for_dumps(int size) {
  const std::string dir = flight_dump_dir();
  const auto until = std::chrono::steady_clock::now() + Config::get().dump_wait;
  for (int k = 0; k < size;) {
    struct stat st;
    if (::stat(concat(dir, "/rank", k, ".json").c_str(), &st) == 0) {
      ++k;
    } else if (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      break;
    }
  }
}

namespace {

std::atomic<std::int64_t> g_last_dump_us{0};
std::atomic<int> g_world_rank{-1};  // set by the first recorder: the dump never calls MPI for it

// "allreduce #5 (4 x float64) peer/root 0": the operation as every message names it (the dumps carry it as "what",
// which `shardkit-trace analyze` prints).
std::string what(const FlightEntry& e) {
  std::string s = op_name(e.op);
  if (e.seq >= 0) s += concat(" #", e.seq);
  if (e.count >= 0) s += concat(" (", e.count, " x ", dtype_name(e.dtype), ")");
  if (e.peer >= 0) s += concat(" peer/root ", e.peer);
  return s;
}

std::string describe(const FlightEntry& e, const std::string& comm) {
  std::string s = what(e) + concat(" on communicator '", comm, "'");
  if (e.site.file) s += concat(" at ", e.site.file, ":", e.site.line);
  return s;
}

}  // namespace
}  // namespace shardkit::detail

namespace shardkit {
CallSite& current_call_site() noexcept {
  thread_local CallSite site;
  return site;
}

namespace {
std::mutex sites_mu;
std::vector<CallSite>& sites() {
  static auto* s = new std::vector<CallSite>{CallSite{}};  // id 0: none; never freed (handlers may outlive statics)
  return *s;
}
}  // namespace

std::int64_t call_site_id(const CallSite& site) {
  if (!site.file) return 0;
  std::lock_guard lock(sites_mu);
  auto& s = sites();
  for (std::size_t i = 1; i < s.size(); ++i)  // few sites: those of the traced calls
    if (s[i].file == site.file && s[i].line == site.line) return static_cast<std::int64_t>(i);
  s.push_back(site);
  return static_cast<std::int64_t>(s.size() - 1);
}

CallSite call_site_of(std::int64_t id) noexcept {
  // Every call of a compiled operation asks (the XLA handler): an id keeps its site for good, so each thread remembers
  // the ids it has seen, a few of them, and takes the lock only for others.
  struct Seen {
    std::int64_t id = 0;
    CallSite site;
  };
  thread_local std::array<Seen, 16> seen{};
  if (id <= 0) return CallSite{};
  Seen& slot = seen[static_cast<std::size_t>(id) % seen.size()];
  if (slot.id == id) return slot.site;
  std::lock_guard lock(sites_mu);
  const auto& s = sites();
  if (static_cast<std::size_t>(id) >= s.size()) return CallSite{};  // not (yet) an id: not remembered
  slot = {id, s[static_cast<std::size_t>(id)]};
  return slot.site;
}
}  // namespace shardkit

namespace shardkit::detail {

FlightRecorder::FlightRecorder(std::string name, int rank, int size, std::vector<int> world_ranks,
                               std::size_t capacity)
    : name_(std::move(name)), rank_(rank), size_(size), world_(std::move(world_ranks)), ring_(capacity) {
  if (!Config::get().trace_dir.empty()) track_ = trace_track(name_);
  if (capacity || track_ >= 0) set_before_abort(&before_abort);
  if (rank_ >= 0 && static_cast<std::size_t>(rank_) < world_.size()) g_world_rank.store(world_[rank_]);
  std::lock_guard lock(registry_mu);
  registry().push_back(this);
}

FlightRecorder::~FlightRecorder() {
  std::lock_guard lock(registry_mu);
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), this), r.end());
}

void FlightRecorder::lock() noexcept {
  while (busy_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
}

Recording FlightRecorder::start(OpKind op, std::int64_t seq, DType dtype, std::int64_t count, int peer,
                                BackendKind backend) {
  auto describe = [&](FlightEntry& e) {
    e.seq = seq;
    e.op = op;
    e.dtype = dtype;
    e.count = count;
    e.peer = peer;
    e.backend = backend;
    e.state = OpState::kStarted;
    e.site = current_call_site();
  };
  Recording r;
  if (track_ >= 0) {
    r.span = std::make_unique<TraceSpan>();
    describe(r.span->entry);
    r.span->track = track_;
    r.span->start_ns = wall_clock_ns();
  }
  if (ring_.empty() && !r.span) return r;
  lock();
  const std::uint64_t id = next_++;
  if (!ring_.empty()) {
    FlightEntry& e = ring_[next_slot_];  // id % capacity, without a division on every operation
    if (++next_slot_ == ring_.size()) next_slot_ = 0;
    e.id = id;
    describe(e);
    e.start_us = coarse_wall_clock_us();
    e.end_us = 0;
    e.pending.reset();
    r.slot = &e;
  }
  unlock();
  if (r.span) r.span->entry.id = id;
  return r;
}

Token FlightRecorder::traced(Recording& r, Token t) {
  if (!r.span || !t.waitable()) return t;
  r.span->completed_ns = std::make_shared<std::atomic<std::int64_t>>(0);
  return trace_completion(std::move(t), r.span->completed_ns);
}

void FlightRecorder::finish(Recording& r, const Token& t) {
  if (r.span) {
    r.span->end_ns = wall_clock_ns();
    r.span->entry.state = OpState::kCompleted;
    trace_span(std::move(*r.span));
    r.span.reset();
  }
  FlightEntry* e = std::exchange(r.slot, nullptr);
  if (!e) return;
  const std::shared_ptr<Waitable>& w = t.waitable();
  lock();
  if (w)
    e->pending = w;
  else
    e->state = OpState::kCompleted;  // no second clock read: its cost would double the recorder's
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
  FlightEntry* e = std::exchange(r.slot, nullptr);
  if (!e) return;
  lock();
  e->state = OpState::kFailed;
  e->end_us = now_ns / 1000;
  unlock();
}

FlightRecorder::Activity FlightRecorder::activity(bool waiting) {
  Activity a;
  lock();
  const std::uint64_t n = std::min<std::uint64_t>(next_, ring_.size());
  const FlightEntry* busy = nullptr;
  for (std::uint64_t k = 0; k < n; ++k) {
    const FlightEntry& e = ring_[(next_ - n + k) % ring_.size()];
    if (e.state == OpState::kStarted && (!e.pending || waiting)) {
      busy = &e;
      break;
    }
  }
  FlightEntry b = busy ? *busy : FlightEntry{}, last = n ? ring_[(next_ - 1) % ring_.size()] : FlightEntry{};
  unlock();
  if (busy) {
    a.busy_since_us = b.start_us;
    a.busy = describe(b, name_);
  }
  if (n) {
    a.last = describe(last, name_) + concat(" (", state_name(last.state), ")");
    a.last_start_us = last.start_us;
  }
  return a;
}

std::string FlightRecorder::json(bool ask_pending) {
  std::string out = "{\"name\": ";
  append_json_string(out, name_);
  out += concat(", \"rank\": ", rank_, ", \"size\": ", size_, ", \"world_ranks\": [");
  for (std::size_t i = 0; i < world_.size(); ++i) out += concat(i ? ", " : "", world_[i]);
  out += "], \"capacity\": " + std::to_string(ring_.size()) + ", \"ops\": [";
  // A copy, taken under the lock; pending tokens are asked outside it (asking may raise, or run a dump itself).
  std::vector<FlightEntry> ops;
  lock();
  const std::uint64_t n = std::min<std::uint64_t>(next_, ring_.size());
  ops.reserve(n);
  for (std::uint64_t k = 0; k < n; ++k) ops.push_back(ring_[(next_ - n + k) % ring_.size()]);
  unlock();
  for (std::uint64_t k = 0; k < n; ++k) {
    FlightEntry& e = ops[k];
    if (ask_pending && e.state == OpState::kStarted && e.pending) {
      try {
        if (e.pending->is_complete()) e.state = OpState::kCompleted;
      } catch (...) {
        e.state = OpState::kFailed;  // its token holds the operation's error
      }
    }
    out += concat(k ? ",\n    " : "\n    ", "{\"id\": ", e.id, ", \"seq\": ", e.seq, ", \"op\": \"", op_name(e.op),
                  "\", \"dtype\": ", e.count < 0 ? "null" : concat("\"", dtype_name(e.dtype), "\""),
                  ", \"count\": ", e.count, ", \"peer\": ", e.peer,
                  ", \"backend\": \"", backend_name(e.backend), "\", \"state\": \"", state_name(e.state),
                  "\", \"start_us\": ", e.start_us, ", \"end_us\": ", e.end_us, ", \"what\": ");
    append_json_string(out, what(e));
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
std::int64_t flight_last_dump_us() noexcept { return g_last_dump_us.load(); }

std::vector<FlightRecorder::Activity> flight_activities(bool waiting) {
  std::vector<FlightRecorder::Activity> out;
  std::lock_guard lock(registry_mu);
  for (FlightRecorder* r : registry())
    if (r->capacity()) out.push_back(r->activity(waiting));
  return out;
}

std::string flight_dump_dir() {
  if (const std::string& d = Config::get().dump_dir; !d.empty()) return d;
  for (const char* v : {"SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"})
    if (const char* id = std::getenv(v); id && *id) {
      std::string s = id;
      std::replace_if(s.begin(), s.end(), [](char c) { return c == '/' || c == ' ' || c == '@'; }, '_');
      return "shardkit-dump-" + s;
    }
  return "shardkit-dump";
}

namespace {
bool write_all(int fd, const std::string& data) {
  for (std::size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Writes `data` to `path` (in `dir`) whole or not at all. The job may end while a rank writes a second dump: an
// unnamed file (O_TMPFILE) is named only once complete, so a killed writer leaves nothing behind; where the file system
// has none, a named temporary file is renamed (and may be left over from a kill).
bool write_whole(const std::string& dir, const std::string& path, const std::string& data) {
  const std::string tmp = concat(path, ".", ::getpid(), ".tmp");
  bool ok = false;
#ifdef O_TMPFILE
  if (const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644); fd >= 0) {
    ::unlink(tmp.c_str());
    ok = write_all(fd, data) && ::linkat(AT_FDCWD, concat("/proc/self/fd/", fd).c_str(), AT_FDCWD, tmp.c_str(),
                                         AT_SYMLINK_FOLLOW) == 0;
    ::close(fd);
  } else
#endif
  if (const int named = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644); named >= 0) {
    ok = write_all(named, data);
    ::close(named);
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) == 0) return true;
  ::unlink(tmp.c_str());
  return false;
}
}  // namespace

std::string dump_flight_records(const std::string& reason, bool local, bool unless_recent) noexcept {
  flush_trace();  // the trace too: the job may end before exit
  thread_local bool dumping = false;  // a token asked while dumping may time out and ask for a dump itself
  if (dumping) return "";
  dumping = true;
  struct Done {
    ~Done() { dumping = false; }
  } done;
  try {
    static std::mutex mu;
    static std::set<std::string> written;
    static std::string first;  // the reason a dump names: the first, then what came after it
    std::lock_guard once(mu);
    if (unless_recent && wall_clock_us() - g_last_dump_us.load() < kRecentDumpUs) return "";
    if (!written.insert(reason).second) return "";
    if (first.empty()) first = reason;
    const std::string why = first == reason ? first : concat(first, " (then: ", reason, ")");
    const std::string activity = describe_activity();
    std::string body;
    {
      std::lock_guard lock(registry_mu);
      for (FlightRecorder* r : registry())
        if (r->capacity()) body += (body.empty() ? "\n  " : ",\n  ") + r->json(local);
    }
    if (local) request_dumps(reason);
    g_last_dump_us.store(wall_clock_us());
    const int rank = g_world_rank.load();
    const std::string dir = flight_dump_dir();
    ::mkdir(dir.c_str(), 0777);  // exists already on the other ranks' hosts: fine
    const std::string path = concat(dir, "/rank", rank, ".json");
    std::string head = concat("{\"rank\": ", rank, ", \"pid\": ", ::getpid(), ", \"time_us\": ", wall_clock_us(),
                              ", \"reason\": ");
    append_json_string(head, why);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    head += ", \"host\": ";
    append_json_string(head, host);
    head += ", \"activity\": ";
    append_json_string(head, activity);
    head += ", \"communicators\": [" + body + "]}\n";
    if (!write_whole(dir, path, head)) return "";
    std::fprintf(stderr, "shardkit: rank %d: flight recorder written to %s (shardkit-trace analyze %s)\n", rank,
                 path.c_str(), dir.c_str());
    return path;
  } catch (...) {
    return "";
  }
}

void end_job_at_exit(const std::string& reason) {
  dump_flight_records(reason);
  request_abort_at_exit(reason);
}

}  // namespace shardkit::detail
