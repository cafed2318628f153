#include "janitor.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "files.hpp"

namespace shardkit::checkpoint::detail {

namespace {

class Janitor {
 public:
  void add(std::string path) {
    std::unique_lock<std::mutex> lock(mu_);
    if (path == current_ || std::find(queue_.begin(), queue_.end(), path) != queue_.end()) return;  // queued already
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { run(); });
      } catch (const std::exception&) {
        // No thread to be had (a thread or process limit): removed here, as saves did before.
        lock.unlock();
        remove_now(path);
        return;
      }
    }
    queue_.push_back(std::move(path));
    work_.notify_one();
  }

  std::size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size() + (current_.empty() ? 0 : 1);
  }

  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return queue_.empty() && current_.empty(); });
  }

  // At exit the queued removals finish (nothing is left half removed that the next save would have to find), then
  // the thread ends.
  ~Janitor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      work_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  static void remove_now(const std::string& path) {
    try {
      remove_tree(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "shardkit: checkpoint: cannot remove '%s' (the next save tries again): %s\n", path.c_str(),
                   e.what());
    }
  }

  void run() {
    lower_this_thread_priority(39);  // the lowest (nice 19) from any nice value (-20 to 19)
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      current_ = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      remove_now(current_);
      lock.lock();
      current_.clear();
      if (queue_.empty()) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<std::string> queue_;
  std::string current_;  // being removed
  bool stop_ = false;
  std::thread thread_;
};

// The process's janitor. A child forked while the parent's had a thread (or held its lock) gets a fresh one: a fork
// copies no thread, and the parent's copy, its lock perhaps held, is left alone (and leaked).
Janitor* g_janitor = nullptr;
std::once_flag g_once;

struct Owner {
  ~Owner() { delete g_janitor; }
};

Janitor& janitor() {
  static Owner owner;  // destroyed at exit: the queued removals finish
  std::call_once(g_once, [] {
    g_janitor = new Janitor();
    ::pthread_atfork(nullptr, nullptr, [] { g_janitor = new Janitor(); });
  });
  return *g_janitor;
}

}  // namespace

void lower_this_thread_priority(int by) {
  if (by <= 0) return;
  const auto tid = static_cast<id_t>(::gettid());
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) (void)::setpriority(PRIO_PROCESS, tid, std::min(19, now + by));
}

void remove_later(std::string path) {
  janitor().add(std::move(path));
}

std::size_t removals_pending() {
  return janitor().pending();
}

void drain_removals() {
  janitor().drain();
}

}  // namespace shardkit::checkpoint::detail
