// The per-rank trace (trace_writer.hpp): the process's one trace file and its chunks of spans (a pending operation's
// completion comes from its entry's, which the flight recorder's token wrapper records).

#include "trace_writer.hpp"

#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "op_table.hpp"
#include "shardkit/collectives/options.hpp"
#include "shardkit/core/clock.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"
#include "transport.hpp"

namespace shardkit::detail {
namespace {

constexpr char kTail[] = "\n]}\n";

// Makes `dir` and its parents (those that exist already are fine: other ranks make them too).
void make_dirs(const std::string& dir) {
  for (std::size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
    ::mkdir(dir.substr(0, at).c_str(), 0777);
    if (at == std::string::npos) return;
  }
}

class TraceFile {
 public:
  // Opens DIR/rank<R>.trace.json and writes its head (false, said once on stderr, when it cannot).
  bool open() {
    if (file_ || failed_) return file_ != nullptr;
    int rank = 0, size = 1;
    if (mpi_initialized() && !mpi_finalized()) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    rank_ = rank;
    const std::string dir = ProcessSettings::current().trace_dir;
    make_dirs(dir);
    path_ = concat(dir, "/rank", rank, ".trace.json");
    file_ = std::fopen(path_.c_str(), "w");
    if (!file_) {
      failed_ = true;
      std::fprintf(stderr, "shardkit: warning: rank %d: SHARDKIT_TRACE: cannot write %s (%s); no trace\n", rank,
                   path_.c_str(), std::strerror(errno));
      return false;
    }
    origin_us_ = wall_clock_us();
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const JobInfo* job = JobInfo::current();
    const ClockOffset clock = job ? job->clock : ClockOffset{};
    std::string head =
        concat("{\"otherData\": {\"shardkit_trace\": 1, \"rank\": ", rank, ", \"size\": ", size, ", \"host\": ");
    append_json_string(head, host);
    head += concat(", \"pid\": ", ::getpid(), ", \"clock_origin_us\": ", origin_us_,
                   ", \"clock_offset_us\": ", clock.offset_us, ", \"clock_rtt_us\": ", clock.rtt_us,
                   ", \"clock_rounds\": ", clock.rounds, "},\n\"traceEvents\": [\n");
    std::string name;
    append_json_string(name, concat("rank ", rank, " (", host, ")"));
    head += concat("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", rank,
                   ", \"tid\": 0, \"args\": {\"name\": ", name,
                   "}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": ", rank,
                   ", \"tid\": 0, \"args\": {\"sort_index\": ", rank, "}}");
    spans_.reserve(kTraceChunk);
    std::atexit([] { flush_trace(); });
    return write(head);
  }

  int add_track(const std::string& name) {
    tracks_.push_back(name);
    return static_cast<int>(tracks_.size());  // tid 0 is the process's own
  }

  void add(TraceSpan&& s) {
    const std::int64_t at = s.end_ns;
    spans_.push_back(std::move(s));
    if (spans_.size() >= kTraceChunk || at - written_ns_ > kTraceFlushNs) flush();
  }

  // Appends the new tracks' names and the held spans, then the end.
  void flush() {
    if (!file_) return;
    std::string out;
    for (; named_ < tracks_.size(); ++named_) {
      const std::size_t tid = named_ + 1;
      out += concat(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": ", rank_, ", \"tid\": ", tid,
                    ", \"args\": {\"name\": ");
      append_json_string(out, tracks_[named_]);
      out += concat("}},\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": ", rank_, ", \"tid\": ", tid,
                    ", \"args\": {\"sort_index\": ", tid, "}}");
    }
    for (const TraceSpan& s : spans_) event(out, s);
    spans_.clear();
    write(out);
    written_ns_ = wall_clock_ns();
  }

  const std::string& path() const { return path_; }

 private:
  // One span as a complete ("X") event; times in microseconds from the file's origin, to the nanosecond.
  void event(std::string& out, const TraceSpan& s) const {
    const FlightEntry& e = s.entry;
    const std::int64_t seen = e.done ? e.done->load(std::memory_order_acquire) : 0;
    const std::int64_t end = seen > 0 ? seen : seen < 0 ? -seen : s.end_ns;
    const bool failed = e.state == OpState::kFailed || seen < 0;
    const OpRecord& w = e.what;
    const std::int64_t bytes = w.count > 0 ? w.count * static_cast<std::int64_t>(dtype_size(w.dtype)) : 0;
    char ts[64];
    std::snprintf(ts, sizeof ts, "%.3f, \"dur\": %.3f", static_cast<double>(s.start_ns - origin_us_ * 1000) / 1e3,
                  static_cast<double>(end > s.start_ns ? end - s.start_ns : 0) / 1e3);
    out += concat(",\n{\"name\": \"", op_name(w.op), "\", \"cat\": \"", transport_name(w.backend),
                  "\", \"ph\": \"X\", \"pid\": ", rank_, ", \"tid\": ", s.track, ", \"ts\": ", ts,
                  ", \"args\": {\"bytes\": ", bytes,
                  ", \"dtype\": ", w.count < 0 ? "null" : concat("\"", dtype_name(w.dtype), "\""),
                  ", \"count\": ", w.count);
    if (w.peer >= 0) out += concat(op_spec(w.op).rooted ? ", \"root\": " : ", \"peer\": ", w.peer);
    out += concat(", \"backend\": \"", transport_name(w.backend), "\", \"communicator\": ");
    append_json_string(out,
                       s.track > 0 && static_cast<std::size_t>(s.track) <= tracks_.size() ? tracks_[s.track - 1] : "");
    out += concat(", \"seq\": ", w.seq, ", \"id\": ", e.id, ", \"state\": \"", failed ? "failed" : "completed", "\"");
    if (e.done) out += seen ? ", \"end\": \"completed\"" : ", \"end\": \"returned\"";
    if (e.site.file) {
      out += ", \"site\": ";
      append_json_string(out, concat(e.site.file, ":", e.site.line));
    }
    out += "}}";
  }

  // Writes `text` where the previous end was, then the end again, and leaves the position before it.
  bool write(const std::string& text) {
    bool ok =
        std::fseek(file_, tail_at_, SEEK_SET) == 0 && std::fwrite(text.data(), 1, text.size(), file_) == text.size();
    tail_at_ = std::ftell(file_);
    ok = ok && std::fputs(kTail, file_) >= 0 && std::fflush(file_) == 0;
    if (!ok && !write_failed_) {
      write_failed_ = true;
      std::fprintf(stderr, "shardkit: warning: rank %d: SHARDKIT_TRACE: writing %s failed (%s)\n", rank_, path_.c_str(),
                   std::strerror(errno));
    }
    return ok;
  }

  std::FILE* file_ = nullptr;
  bool failed_ = false, write_failed_ = false;
  std::string path_;
  int rank_ = 0;
  std::int64_t origin_us_ = 0;
  long tail_at_ = 0;
  std::int64_t written_ns_ = 0;  // when spans were last written
  std::vector<std::string> tracks_;
  std::size_t named_ = 0;  // tracks whose names are in the file
  std::vector<TraceSpan> spans_;
};

std::mutex trace_mu;
TraceFile& trace_file() {
  static auto* f = new TraceFile();  // never freed: spans may come during static destruction, and atexit flushes
  return *f;
}

}  // namespace

int trace_track(const std::string& name) {
  std::lock_guard lock(trace_mu);
  TraceFile& f = trace_file();
  return f.open() ? f.add_track(name) : -1;
}

void trace_span(TraceSpan&& span) noexcept {
  try {
    std::lock_guard lock(trace_mu);
    trace_file().add(std::move(span));
  } catch (...) {
  }
}

std::string flush_trace() noexcept {
  try {
    std::lock_guard lock(trace_mu);
    TraceFile& f = trace_file();
    f.flush();
    return f.path();
  } catch (...) {
    return "";
  }
}

}  // namespace shardkit::detail
