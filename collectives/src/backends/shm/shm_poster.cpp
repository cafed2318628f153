#include "backends/shm/shm_poster.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "shardkit/core/interrupt.hpp"
#include "shardkit/launch/mpi.hpp"
#include "backends/shm/shm_p2p.hpp"

namespace shardkit::detail {
namespace {

using namespace std::chrono_literals;

class Poster {
 public:
  void track(ShmP2p& p) {
    const std::lock_guard lk(mu_);
    all_.push_back(&p);
  }

  void add(ShmP2p& p) {
    std::unique_lock lk(mu_);
    list_.push_back(&p);
    if (!started_) start();  // where it cannot start, the senders' own calls post what is pending (and it tries again)
    if (sleeping_on_)
      shm_ring(sleeping_on_->doorbell());  // asleep on another sender's doorbell: look at this one now
    else
      cv_.notify_all();
  }

  void remove(ShmP2p& p) noexcept {
    std::unique_lock lk(mu_);
    std::erase(list_, &p);
    std::erase(all_, &p);
    // Asleep on its doorbell: woken, and awake before `p` (and the segment with its doorbell) goes.
    while (sleeping_on_ == &p) wake(lk);
  }

  void close_all() noexcept {
    std::unique_lock lk(mu_);
    for (ShmP2p* p : all_) p->close_end();
    // Until what is pending is posted (or dropped, to closed ends), each sender's timeout at most. Pending sends, not
    // the list: one stays listed while another thread is inside it (a receive that never ends), which posts its own.
    auto pending = [&] { return std::ranges::any_of(list_, [](const ShmP2p* p) { return p->has_pending(); }); };
    const auto now = std::chrono::steady_clock::now();
    auto deadline = now;
    for (ShmP2p* p : list_) {
      if (!p->has_pending()) continue;
      const std::chrono::milliseconds t = p->pending_timeout();
      deadline = t.count() == 0 ? std::chrono::steady_clock::time_point::max() : std::max(deadline, now + t);
      if (t.count() == 0) break;
    }
    const InterruptibleWait waiting;
    while (pending() && interrupt_signal() == 0 && std::chrono::steady_clock::now() < deadline)
      cv_.wait_for(lk, 20ms);  // the poster says when it has emptied the list
    for (ShmP2p* p : all_) p->report_lost();
  }

 private:
  void start() noexcept {
    // Signals go to the application's threads, never to this one (SIGINT must reach the thread that waits).
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    try {
      std::thread([this] { run(); }).detach();
      started_ = true;
    } catch (const std::exception& e) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "shardkit: warning: no thread to post pending point-to-point sends (%s): only the "
                     "sender's own calls post them\n",
                     e.what());
      });
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }

  // Rings the doorbell it sleeps on and waits a while for it to wake (mu_ held by `lk`).
  void wake(std::unique_lock<std::mutex>& lk) {
    shm_ring(sleeping_on_->doorbell());
    cv_.wait_for(lk, 10ms);
  }

  // Posts for every sender it holds: one whose sends are all posted leaves the list. Returns one with sends still
  // pending that no other thread is inside (nullptr: none), and whether some owner was inside its own.
  ShmP2p* post_all(bool& busy) {
    ShmP2p* left = nullptr;
    busy = false;
    for (auto it = list_.begin(); it != list_.end();) {
      switch ((*it)->post_in_background()) {
        case ShmP2p::Posted::kAll:
          it = list_.erase(it);
          continue;
        case ShmP2p::Posted::kSome:
          left = left ? left : *it;
          break;
        case ShmP2p::Posted::kBusy:
          busy = true;
          break;
      }
      ++it;
    }
    return left;
  }

  void run() {
    std::unique_lock lk(mu_);
    auto busy_wait = 50us;
    for (;;) {
      if (list_.empty()) {
        cv_.wait(lk);
        continue;
      }
      bool busy = false;
      ShmP2p* left = post_all(busy);
      if (list_.empty()) cv_.notify_all();  // close_all() may wait for it
      if (!left) {
        if (busy) {  // owners post their own while inside: look again later, less often the longer they stay
          cv_.wait_for(lk, busy_wait);
          busy_wait = std::min<std::chrono::microseconds>(busy_wait * 2, 10ms);
        }
        continue;
      }
      busy_wait = 50us;
      // Sleeps on its doorbell, counted among its sleepers before a last look (as shm_wait_until does), so that a
      // receiver freeing an entry meanwhile rings it. (Meanwhile every post to this rank rings it too: a futex wake
      // per message while this rank's sends wait for room.)
      ShmLine& bell = left->doorbell();
      bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const std::uint32_t seen = bell.flag.load(std::memory_order_seq_cst);
      const ShmP2p::Posted now = left->post_in_background();
      if (now == ShmP2p::Posted::kSome) {
        sleeping_on_ = left;
        const auto most = list_.size() > 1 ? 1ms : 50ms;  // the others' receivers ring other doorbells
        lk.unlock();
        shm_sleep(bell, seen, most);
        lk.lock();
        sleeping_on_ = nullptr;
        cv_.notify_all();  // remove() may wait for it
      }
      bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (now == ShmP2p::Posted::kAll) std::erase(list_, left);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ShmP2p*> list_;  // with sends pending
  std::vector<ShmP2p*> all_;   // alive
  ShmP2p* sleeping_on_ = nullptr;
  bool started_ = false;
};

std::atomic<Poster*> g_poster{nullptr};

// Lives as long as the process (never destroyed: a communicator freed during static destruction still removes its
// sender), as does its thread, which holds only senders whose communicators are alive. A child forked meanwhile has
// no such thread, and may have its lock held by it at the fork: it gets a poster of its own (the parent's
// communicators are not the child's to use).
Poster& poster() {
  static const bool made = [] {
    g_poster.store(new Poster);
    pthread_atfork(nullptr, nullptr, [] { g_poster.store(new Poster); });
    set_before_finalize(&shm_poster_close_all);
    return true;
  }();
  (void)made;
  return *g_poster.load();
}

}  // namespace

void shm_poster_track(ShmP2p& p) {
  poster().track(p);
}

void shm_poster_close_all() noexcept {
  poster().close_all();
}

void shm_poster_add(ShmP2p& p) {
  poster().add(p);
}

void shm_poster_remove(ShmP2p& p) noexcept {
  poster().remove(p);
}

}  // namespace shardkit::detail
