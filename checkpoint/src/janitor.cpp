#include "janitor.hpp"

#include <unistd.h>

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
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(path));
    if (thread_ == nullptr || owner_ != ::getpid()) {
      // The first removal of this process (or of a child forked from one that had the thread: a fork copies no
      // thread, so the child starts its own and never touches the parent's).
      owner_ = ::getpid();
      thread_ = new std::thread([this] { run(); });
    }
    work_.notify_one();
  }

  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    if (owner_ != ::getpid()) return;
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

  // At exit the queued removals finish (nothing is left half removed that the next save would have to find), then
  // the thread ends. A forked child's copy leaves the parent's thread alone.
  ~Janitor() {
    std::unique_lock<std::mutex> lock(mu_);
    if (thread_ == nullptr || owner_ != ::getpid()) return;
    stop_ = true;
    work_.notify_one();
    lock.unlock();
    thread_->join();
    delete thread_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const std::string path = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      try {
        remove_tree(path);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "shardkit: checkpoint: cannot remove '%s' (the next save tries again): %s\n", path.c_str(),
                     e.what());
      }
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<std::string> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread* thread_ = nullptr;
  pid_t owner_ = 0;
};

Janitor& janitor() {
  static Janitor j;
  return j;
}

}  // namespace

void remove_later(std::string path) {
  janitor().add(std::move(path));
}

void drain_removals() {
  janitor().drain();
}

}  // namespace shardkit::checkpoint::detail
