// The watchdog (watchdog.hpp): a UDP socket and a thread per process, the addresses of every rank's, SIGUSR1, and
// the hang warning.

#include "watchdog.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>
#include <utility>

#include "backend.hpp"
#include "flight_recorder.hpp"
#include "backends/mpi/mpi_request.hpp"
#include "shardkit/collectives/options.hpp"
#include "shardkit/core/clock.hpp"
#include "shardkit/core/error.hpp"
#include "shardkit/core/interrupt.hpp"

namespace shardkit::detail {
namespace {

constexpr int kMaxAddrs = 4;
constexpr char kMagic[] = "SKWD1";

// What each rank publishes: its UDP port and up to four IPv4 addresses (network order), and the job's nonce.
struct Address {
  std::uint64_t nonce;
  std::uint32_t ip[kMaxAddrs];
  std::uint16_t port;
  std::uint16_t n;
};

struct Watchdog {
  int sock = -1;
  int wake[2] = {-1, -1};  // SIGUSR1's handler writes a byte here
  int rank = 0;
  std::uint64_t nonce = 0;
  std::vector<Address> peers;
  std::int64_t warned_since_us = 0;  // the hang warning's operation (its start): once per operation
  int usr1_count = 0;
  int handed_on = 0;                  // SIGINT/SIGTERM that went to Python's handler while an operation ran
  std::int64_t handed_on_at_us = 0, handed_on_busy_us = 0;
};

std::atomic<Watchdog*> g_dog{nullptr};
std::atomic<void (*)()> g_before_exchange{nullptr};  // tests: runs before the set-up's exchange
struct sigaction g_previous_usr1 {};

std::string seconds(std::int64_t us) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(us) / 1e6);
  return b;
}

void on_usr1(int sig, siginfo_t* info, void* context) {  // async-signal-safe: write(2) and the previous handler
  if (Watchdog* d = g_dog.load(); d && d->wake[1] >= 0) {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(d->wake[1], "u", 1);
    errno = saved;
  }
  if (g_previous_usr1.sa_flags & SA_SIGINFO) {
    if (g_previous_usr1.sa_sigaction) g_previous_usr1.sa_sigaction(sig, info, context);
  } else if (g_previous_usr1.sa_handler != SIG_DFL && g_previous_usr1.sa_handler != SIG_IGN) {
    g_previous_usr1.sa_handler(sig);
  }
}

// This host's IPv4 addresses other than loopback (127.0.0.1 when it has none), at most kMaxAddrs.
void local_addresses(Address& a) {
  a.n = 0;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i && a.n < kMaxAddrs; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      const std::uint32_t ip = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      if ((ntohl(ip) >> 24) == 127) continue;
      a.ip[a.n++] = ip;
    }
    ::freeifaddrs(list);
  }
  if (a.n == 0) a.ip[a.n++] = htonl(INADDR_LOOPBACK);
}

void send_to_all(Watchdog& d, char kind, const std::string& reason) noexcept {
  char msg[1024];
  const int len = std::snprintf(msg, sizeof msg, "%s %llx %d %c %s", kMagic, static_cast<unsigned long long>(d.nonce),
                                d.rank, kind, reason.c_str());
  const std::size_t bytes = std::min<std::size_t>(static_cast<std::size_t>(std::max(len, 0)), sizeof msg - 1);
  for (std::size_t r = 0; r < d.peers.size(); ++r) {
    if (static_cast<int>(r) == d.rank) continue;
    const Address& p = d.peers[r];
    for (int k = 0; k < p.n && k < kMaxAddrs; ++k) {
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = p.port;
      to.sin_addr.s_addr = p.ip[k];
      ::sendto(d.sock, msg, bytes, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&to), sizeof to);
    }
  }
}

void say(const std::string& line) {
  std::fprintf(stderr, "shardkit: rank %d: %s\n", flight_world_rank(), line.c_str());
  std::fflush(stderr);
}

// What this rank does, over all its communicators: the oldest operation in progress and the newest one.
struct RankActivity {
  FlightRecorder::Activity busy;  // busy_since_us 0: nothing in progress
  FlightRecorder::Activity last;  // last empty: no operation yet
};

RankActivity rank_activity() {
  RankActivity r;
  for (auto& a : flight_activities(waits_in_progress())) {
    if (a.busy_since_us && (!r.busy.busy_since_us || a.busy_since_us < r.busy.busy_since_us)) r.busy = a;
    if (!a.last.empty() && (r.last.last.empty() || a.last_start_us > r.last.last_start_us)) r.last = std::move(a);
  }
  return r;
}

// The oldest operation in progress here (its start; 0: none).
std::int64_t busy_since() { return rank_activity().busy.busy_since_us; }

// A dump (and, for `report`, the line saying what this rank does) asked for by `from`.

void on_request(Watchdog& d, int from, bool report, const std::string& reason) {
  // Every rank that times out asks: one dump per burst is what the analyzer needs (the first describes the hang), and
  // a rank that has just written its own has nothing to add.
  if (wall_clock_us() - flight_last_dump_us() < kRecentDumpUs) return;
  if (report) {
    say(describe_activity());
    d.warned_since_us = busy_since();  // this rank's line about its wait is said: no second one from its own warning
  }
  // Asked again under the dumps' lock: this rank's own may be being written now.
  dump_flight_records(concat("asked by rank ", from, ": ", reason), false, /*unless_recent=*/true);
}

// A dump this rank decides on from its watchdog (SIGUSR1, the hang warning): the line, the others, the dump.
void report_and_dump(Watchdog& d, const std::string& reason) {
  say(describe_activity());
  send_to_all(d, 'h', reason);
  dump_flight_records(reason, false);
}

void check_hang(Watchdog& d) {
  const auto warn = ProcessSettings::current().hang_warn;
  if (warn.count() <= 0) return;
  const std::int64_t since = busy_since();
  if (!since || since == d.warned_since_us || wall_clock_us() - since < warn.count() * 1000) return;
  d.warned_since_us = since;
  report_and_dump(d, concat("hang warning: rank ", d.rank, " has waited ", seconds(wall_clock_us() - since),
                            " s (SHARDKIT_HANG_WARN_S; the job goes on)"));
}

// A signal handed on to Python's handler while this rank's thread is in a blocking MPI call (no timeout: the fast
// path) would raise KeyboardInterrupt only when that call returns, which may be never. If the same operation is still
// in progress a second later, tell the others, write the dumps, and end the rank as the signal's default action would
// (the launcher then ends the job).
void check_blocked_signal(Watchdog& d) {
  if (const int sig = take_handed_on_signal()) {
    d.handed_on = sig;
    d.handed_on_at_us = wall_clock_us();
    d.handed_on_busy_us = busy_since();
  }
  if (!d.handed_on || wall_clock_us() - d.handed_on_at_us < 500000) return;
  const int sig = std::exchange(d.handed_on, 0);
  if (!d.handed_on_busy_us || busy_since() != d.handed_on_busy_us || waits_in_progress()) return;  // it moved on
  const std::string reason = concat(sig == SIGINT ? "SIGINT" : "SIGTERM", " on rank ", d.rank, " while it was ",
                                    describe_activity(), ", a blocking MPI call that nothing interrupts");
  say(reason + "; ending the rank (with SHARDKIT_TIMEOUT_S set, waits end with KeyboardInterrupt instead)");
  send_to_all(d, 'd', reason);
  dump_flight_records(reason, false);
  wait_for_dumps(static_cast<int>(d.peers.size()));
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::kill(::getpid(), sig);  // to the process: a thread that does not block it takes the default action
}

void receive(Watchdog& d) {
  char buf[1100];
  for (;;) {
    const ssize_t n = ::recv(d.sock, buf, sizeof buf - 1, MSG_DONTWAIT);
    if (n <= 0) return;
    buf[n] = '\0';
    unsigned long long nonce = 0;
    int from = -1, used = 0;
    char kind = 0;
    if (std::sscanf(buf, "SKWD1 %llx %d %c %n", &nonce, &from, &kind, &used) < 3 || nonce != d.nonce || used <= 0)
      continue;  // not ours: another job's, or noise
    on_request(d, from, kind == 'h', buf + used);
  }
}

void run(Watchdog* d) {
  for (;;) {
    pollfd fds[2] = {{d->sock, POLLIN, 0}, {d->wake[0], POLLIN, 0}};
    ::poll(fds, 2, 250);
    try {
      if (fds[1].revents & POLLIN) {
        char b[64];
        while (::read(d->wake[0], b, sizeof b) > 0) {
        }
        report_and_dump(*d, concat("SIGUSR1 (", ++d->usr1_count, ") on rank ", d->rank));
      }
      if (fds[0].revents & POLLIN) receive(*d);
      check_hang(*d);
      check_blocked_signal(*d);
    } catch (...) {
      // The watchdog must never take the process down; a failed report is retried at the next event.
    }
  }
}

}  // namespace

std::string describe_activity() {
  const RankActivity act = rank_activity();
  const FlightRecorder::Activity* busy = act.busy.busy_since_us ? &act.busy : nullptr;
  const FlightRecorder::Activity* last = act.last.last.empty() ? nullptr : &act.last;
  const std::int64_t now = wall_clock_us();
  if (busy) {
    const std::time_t t = static_cast<std::time_t>(busy->busy_since_us / 1000000);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char when[32];
    std::strftime(when, sizeof when, "%H:%M:%S UTC", &tm);
    return concat("waiting ", seconds(now - busy->busy_since_us), " s (since ", when, ") for ", busy->busy);
  }
  if (last)
    return concat("in none of shardkit's operations; its last, started ", seconds(now - last->last_start_us),
                  " s ago: ", last->last);
  return "in none of shardkit's operations, and has run none yet";
}

void watchdog_before_exchange_for_tests(void (*hook)()) noexcept {
  g_before_exchange.store(hook);
}

void request_dumps(const std::string& reason) noexcept {
  if (Watchdog* d = g_dog.load()) send_to_all(*d, 'd', reason);
}

void start_watchdog(MpiCommHandle control, const std::string& name, const CommOptions& options, AbortState& abort) {
  static bool started = false;  // the first world communicator's creation, on every rank alike
  if (started || options.trace_buffer == 0) return;
  started = true;
  MPI_Comm c = to_mpi<MPI_Comm>(control);
  int rank = 0, size = 1;
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size));

  auto d = std::make_unique<Watchdog>();
  d->rank = rank;
  Address me{};
  me.nonce = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(wall_clock_us());
  d->sock = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (d->sock >= 0) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof any;
    if (::bind(d->sock, reinterpret_cast<sockaddr*>(&any), sizeof any) == 0 &&
        ::getsockname(d->sock, reinterpret_cast<sockaddr*>(&any), &len) == 0) {
      me.port = any.sin_port;
      local_addresses(me);
    }
  }
  // The exchange is collective, so it runs whether or not this rank got a socket (n = 0: nobody can reach it). What
  // it reads and writes is on the heap and kept for good if the wait times out: MPI may still use it afterwards.
  struct Exchange {
    Address me;
    std::vector<Address> all;
  };
  auto x = std::make_shared<Exchange>(Exchange{me, std::vector<Address>(static_cast<std::size_t>(size))});
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  if (const auto hook = g_before_exchange.load()) hook();
  SHARDKIT_MPI_CHECK(MPI_Iallgather(&x->me, sizeof me, MPI_BYTE, x->all.data(), sizeof me, MPI_BYTE, c, req.data()));
  const OpContext ctx = OpContext::for_step(OpKind::kAllgather, "the watchdog's set-up", name, options.timeout);
  wait_or_raise(req, x, ctx, abort, "not every rank arrived");
  d->peers = x->all;
  d->nonce = d->peers[0].nonce;  // rank 0's: the job's
  if (d->sock < 0 || ::pipe2(d->wake, O_CLOEXEC | O_NONBLOCK) != 0) return;  // no watchdog here; the others go on

  Watchdog* dog = d.release();  // lives as long as the process: its thread may act until the very end
  g_dog.store(dog);
  if (ProcessSettings::current().handle_signals) {
    struct sigaction sa {};
    sa.sa_sigaction = on_usr1;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGUSR1, &sa, &g_previous_usr1);
  }
  // Signals go to the application's threads, never to this one (SIGINT must reach the thread that waits).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  std::thread(run, dog).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace shardkit::detail
