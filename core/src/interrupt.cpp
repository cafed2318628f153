#include "shardkit/core/interrupt.hpp"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "shardkit/core/error.hpp"

namespace shardkit {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM};
constexpr int kSignalCount = sizeof(kSignals) / sizeof(kSignals[0]);

// Written before the handlers go in and after they come out; the handlers only read them.
struct sigaction g_previous[kSignalCount];
std::atomic<bool> g_installed{false};
std::atomic<int> g_signal{0};   // the signal that interrupted a wait, 0 when none
std::atomic<int> g_waiting{0};  // threads inside an InterruptibleWait
std::atomic<int> g_handed_on{0};  // a signal outside any wait that went to a handler (Python's), for the watchdog
std::mutex g_install_mu;

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

int slot_of(int sig) {
  for (int i = 0; i < kSignalCount; ++i)
    if (kSignals[i] == sig) return i;
  return -1;
}

// Async-signal-safe: atomics, sigaction, raise and the previous handler only.
void on_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const int i = slot_of(sig);
  int none = 0;
  // The first signal while a wait is in progress ends that wait; a second one, or one outside any wait, is the
  // previous disposition's alone.
  const bool ends_wait = g_waiting.load() > 0 && g_signal.compare_exchange_strong(none, sig);
  const struct sigaction& prev = g_previous[i];
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, context);
    if (!ends_wait) g_handed_on.store(sig);
  } else if (prev.sa_handler == SIG_DFL) {
    if (!ends_wait) {  // the default action (ending the process), as if shardkit were not there
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(sig, &dfl, nullptr);
      raise(sig);
    }
  } else if (prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);  // Python's handler: KeyboardInterrupt follows in the main thread as usual
    if (!ends_wait) g_handed_on.store(sig);  // ... unless that thread is inside a blocking MPI call
  }
  errno = saved_errno;
}

}  // namespace

bool install_interrupt_handlers() noexcept {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (g_installed.load()) return true;
  for (int i = 0; i < kSignalCount; ++i) {
    struct sigaction sa = {};
    if (sigaction(kSignals[i], nullptr, &g_previous[i]) != 0) return false;
    sa.sa_sigaction = on_signal;
    sigfillset(&sa.sa_mask);
    // Keep the previous handler's flags (Python's leave out SA_RESTART so that its sleeps and reads see EINTR).
    const bool had_handler = (g_previous[i].sa_flags & SA_SIGINFO) || (g_previous[i].sa_handler != SIG_DFL &&
                                                                        g_previous[i].sa_handler != SIG_IGN);
    sa.sa_flags = SA_SIGINFO | (had_handler ? (g_previous[i].sa_flags & (SA_RESTART | SA_ONSTACK)) : SA_RESTART);
    if (sigaction(kSignals[i], &sa, nullptr) != 0) {
      for (int j = 0; j < i; ++j) sigaction(kSignals[j], &g_previous[j], nullptr);
      return false;
    }
  }
  g_installed.store(true);
  return true;
}

void uninstall_interrupt_handlers() noexcept {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (!g_installed.load()) return;
  for (int i = 0; i < kSignalCount; ++i) {
    struct sigaction current = {};
    // Someone who replaced ours after us (signal.signal in Python) keeps theirs.
    if (sigaction(kSignals[i], nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == on_signal)
      sigaction(kSignals[i], &g_previous[i], nullptr);
  }
  g_installed.store(false);
}

bool interrupt_handlers_installed() noexcept { return g_installed.load(); }

int interrupt_signal() noexcept { return g_signal.load(std::memory_order_relaxed); }

void request_interrupt(int signal) noexcept {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
}

bool waits_in_progress() noexcept { return g_waiting.load() > 0; }

int take_handed_on_signal() noexcept { return g_handed_on.exchange(0); }

InterruptibleWait::InterruptibleWait() noexcept { g_waiting.fetch_add(1); }
InterruptibleWait::~InterruptibleWait() { g_waiting.fetch_sub(1); }

namespace detail {

void clear_interrupt() noexcept { g_signal.store(0); }

void throw_interrupted(const std::string& what, const std::string& consequence) {
  const int s = interrupt_signal();
  const char* name = s == SIGINT ? "SIGINT" : s == SIGTERM ? "SIGTERM" : "a signal";
  throw Interrupted(concat(what, " was interrupted by ", name, " while waiting", consequence.empty() ? "" : "; ",
                           consequence),
                    s);
}

}  // namespace detail
}  // namespace shardkit
