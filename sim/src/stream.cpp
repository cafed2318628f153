// Simulated streams and events. Each stream has one worker thread that runs its queue in order; before each operation
// it sleeps a seeded random time (SHARDKIT_SIM_DELAY_US, SHARDKIT_SIM_SEED) so that work left unordered by a missing
// wait completes late, as it may on a GPU. Events count their records: a query or synchronize looks at the latest
// record at the time of the call, and a cross-stream wait blocks the waiting worker until that record has run.

#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "shardkit/sim/sim.hpp"
#include "sim_internal.hpp"

namespace shardkit::sim {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
}  // namespace

const Settings& settings() {
  static const Settings s = [] {
    Settings r;
    // One device per rank on the node by default, as on a GPU node run with one rank per GPU, and at least two, so
    // that work on a device other than the thread's current one is exercised even at one rank.
    const int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("SLURM_NTASKS_PER_NODE", 1));
    r.devices = env_int("SHARDKIT_SIM_GPUS", local > 2 ? local : 2);
    r.seed = static_cast<std::uint64_t>(env_int("SHARDKIT_SIM_SEED", 1));
    r.delay_us = env_int("SHARDKIT_SIM_DELAY_US", 200);
    return r;
  }();
  return s;
}

void fatal(const std::string& what) {
  std::fprintf(stderr, "shardkit sim: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---- devices ----------------------------------------------------------------------------------------------------
namespace {
thread_local int tls_device = 0;  // CUDA: each host thread starts on device 0
thread_local cudaError_t tls_last_error = cudaSuccess;
}  // namespace

int current_device() { return tls_device; }
void set_current_device(int d) { tls_device = d; }
void set_last_error(cudaError_t e) { tls_last_error = e; }
cudaError_t take_last_error() {
  const cudaError_t e = tls_last_error;
  tls_last_error = cudaSuccess;
  return e;
}
cudaError_t peek_last_error() { return tls_last_error; }

// ---- streams ----------------------------------------------------------------------------------------------------
namespace {
std::atomic<std::uint64_t> stream_counter{0};

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct StreamTable {
  std::mutex mu;
  std::map<cudaStream_t, std::shared_ptr<Stream>> live;
  std::map<int, std::shared_ptr<Stream>> defaults;
  // Destroyed streams still finishing their queues (their workers hold the last reference): device-wide
  // synchronisation (cudaDeviceSynchronize, cudaFree) waits for them too, as it does for CUDA's.
  std::vector<std::weak_ptr<Stream>> retired;
};
StreamTable& table() {
  static auto* t = new StreamTable();
  return *t;
}
}  // namespace

Stream::Stream(int device, unsigned /*flags*/) : device_(device) {
  rng_ = settings().seed * 0x100000001b3ULL + stream_counter.fetch_add(1) +
         (static_cast<std::uint64_t>(std::atoi(std::getenv("OMPI_COMM_WORLD_RANK") ? std::getenv("OMPI_COMM_WORLD_RANK")
                                                                                   : "0"))
          << 32);
}

void Stream::enqueue(std::function<void()> op) {
  std::lock_guard lock(mu_);
  queue_.push_back(std::move(op));
  ++queued_;
  cv_.notify_one();
}

void Stream::synchronize() {
  std::unique_lock lock(mu_);
  const std::uint64_t target = queued_;
  done_cv_.wait(lock, [&] { return done_ >= target; });
}

bool Stream::idle() {
  std::lock_guard lock(mu_);
  return done_ == queued_;
}

void Stream::retire() {
  std::lock_guard lock(mu_);
  retired_ = true;
  cv_.notify_one();
}

void Stream::run() {
  set_current_device(device_);
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || retired_; });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    const int delay = settings().delay_us;
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(splitmix(rng_) % (delay + 1)));
    op();
    {
      std::lock_guard lock(mu_);
      ++done_;
    }
    done_cv_.notify_all();
  }
}

namespace {
std::shared_ptr<Stream> start(int device, unsigned flags) {
  auto s = std::make_shared<Stream>(device, flags);
  // The worker owns a reference: a destroyed stream finishes its queue, as cudaStreamDestroy promises.
  std::thread([s] { s->run(); }).detach();
  return s;
}
}  // namespace

cudaStream_t create_stream(unsigned flags) {
  auto s = start(current_device(), flags);
  auto h = reinterpret_cast<cudaStream_t>(s.get());
  std::lock_guard lock(table().mu);
  table().live[h] = std::move(s);
  return h;
}

bool destroy_stream(cudaStream_t h) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard lock(table().mu);
    auto it = table().live.find(h);
    if (it == table().live.end()) return false;
    s = std::move(it->second);
    table().live.erase(it);
    std::erase_if(table().retired, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
    table().retired.push_back(s);
  }
  s->retire();
  return true;
}

std::shared_ptr<Stream> stream_of(cudaStream_t h) {
  std::lock_guard lock(table().mu);
  if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread) {
    auto& d = table().defaults[current_device()];
    if (!d) d = start(current_device(), 0);
    return d;
  }
  auto it = table().live.find(h);
  if (it == table().live.end()) fatal("use of an unknown or destroyed CUDA stream");
  return it->second;
}

void synchronize_device(int device) {
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard lock(table().mu);
    for (auto& [h, s] : table().live)
      if (device < 0 || s->device() == device) all.push_back(s);
    for (auto& [d, s] : table().defaults)
      if (device < 0 || d == device) all.push_back(s);
    for (auto& w : table().retired)
      if (auto s = w.lock(); s && (device < 0 || s->device() == device)) all.push_back(std::move(s));
  }
  for (auto& s : all) s->synchronize();
}

// ---- events -----------------------------------------------------------------------------------------------------
namespace {
struct EventTable {
  std::mutex mu;
  std::map<cudaEvent_t, std::shared_ptr<Event>> live;
};
EventTable& events() {
  static auto* t = new EventTable();
  return *t;
}
}  // namespace

cudaEvent_t create_event() {
  auto e = std::make_shared<Event>();
  e->device = current_device();
  auto h = reinterpret_cast<cudaEvent_t>(e.get());
  std::lock_guard lock(events().mu);
  events().live[h] = std::move(e);
  return h;
}

bool destroy_event(cudaEvent_t h) {
  std::lock_guard lock(events().mu);
  return events().live.erase(h) == 1;  // a pending record keeps its own reference
}

std::shared_ptr<Event> event_of(cudaEvent_t h) {
  std::lock_guard lock(events().mu);
  auto it = events().live.find(h);
  if (it == events().live.end()) fatal("use of an unknown or destroyed CUDA event");
  return it->second;
}

// ---- kernels ----------------------------------------------------------------------------------------------------
int launch(CUstream_st* stream, std::function<void()> kernel) {
  auto s = stream_of(stream);
  if (s->device() != current_device()) {
    set_last_error(cudaErrorInvalidResourceHandle);
    return cudaErrorInvalidResourceHandle;
  }
  s->enqueue(std::move(kernel));
  return cudaSuccess;
}

}  // namespace shardkit::sim
