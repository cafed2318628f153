// The flight recorder's dumps (flight_recorder.hpp): every live recorder of this process written, whole, to
// <dump dir>/rank<world rank>.json, and the wait for the other ranks' dumps before the job ends.

#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

#include "flight_recorder.hpp"
#include "shardkit/core/clock.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/launch/mpi.hpp"
#include "trace_writer.hpp"
#include "watchdog.hpp"

namespace shardkit::detail {
namespace {

std::atomic<std::int64_t> g_last_dump_us{0};

// The job's identity as the dumps write it ("job": "<16 hex digits>").
std::string job_text() {
  const std::uint64_t job = flight_job_id();
  if (job == 0) return "";  // no Runtime (a caller's own MPI): unknown
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(job));
  return b;
}

}  // namespace

// Ranks waiting in the same operation time out moments apart: the wait lets the others' dumps appear.
void dump_before_abort(const std::string& reason) {
  flush_trace();
  dump_flight_records(reason);
  int size = 1;
  if (mpi_initialized() && !mpi_finalized()) MPI_Comm_size(MPI_COMM_WORLD, &size);
  wait_for_dumps(size);
}

std::int64_t flight_last_dump_us() noexcept { return g_last_dump_us.load(); }

std::string flight_dump_dir() {
  if (const std::string& d = ProcessSettings::current().dump_dir; !d.empty()) return d;
  for (const char* v : {"SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"})
    if (const char* id = std::getenv(v); id && *id) {
      std::string s = id;
      std::replace_if(s.begin(), s.end(), [](char c) { return c == '/' || c == ' ' || c == '@'; }, '_');
      return "shardkit-dump-" + s;
    }
  // No launcher's id: the job's own, never an earlier job's directory (none known: the fixed name).
  return job_text().empty() ? std::string("shardkit-dump") : "shardkit-dump-" + job_text();
}

void wait_for_dumps(int size) {
  const std::string dir = flight_dump_dir();
  // This job's dumps name it; where it is unknown (no Runtime) any file of the name counts.
  const std::string mine = job_text().empty() ? std::string("\"job\": ") : concat("\"job\": \"", job_text(), "\"");
  const auto until = std::chrono::steady_clock::now() + ProcessSettings::current().dump_wait;
  // A rank's dump of this job: its head names the job (a file an earlier job left names another).
  auto ours = [&](int k) {
    char head[256] = {};
    const int fd = ::open(concat(dir, "/rank", k, ".json").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const ssize_t n = ::read(fd, head, sizeof head - 1);
    ::close(fd);
    return n > 0 && std::string_view(head, static_cast<std::size_t>(n)).find(mine) != std::string_view::npos;
  };
  for (int k = 0; k < size;) {
    if (ours(k)) {
      ++k;
    } else if (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      break;
    }
  }
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
  thread_local bool dumping = false;  // a dump that ends in another (a failure on the way) writes none
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
    for (const auto& r : live_flight_recorders())
      if (r->capacity()) body += (body.empty() ? "\n  " : ",\n  ") + r->json();
    if (local) request_dumps(reason);
    g_last_dump_us.store(wall_clock_us());
    const int rank = flight_world_rank();
    const std::string dir = flight_dump_dir();
    ::mkdir(dir.c_str(), 0777);  // exists already on the other ranks' hosts: fine
    const std::string path = concat(dir, "/rank", rank, ".json");
    const std::string job = job_text().empty() ? std::string("null") : concat("\"", job_text(), "\"");
    std::string head = concat("{\"rank\": ", rank, ", \"job\": ", job, ", \"pid\": ", ::getpid(),
                              ", \"time_us\": ", wall_clock_us(), ", \"reason\": ");
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
