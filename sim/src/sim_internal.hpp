#pragma once

// Internals shared by the simulated CUDA runtime, cuBLAS and NCCL: memory regions, streams and events, the current
// device, and the environment settings.

#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace shardkit::sim {

// ---- settings (environment, read once) ----------------------------------------------------------------------------
struct Settings {
  int devices = 2;              // SHARDKIT_SIM_GPUS, default: the node-local rank count of the launcher, at least 2
  std::uint64_t seed = 1;       // SHARDKIT_SIM_SEED
  int delay_us = 200;           // SHARDKIT_SIM_DELAY_US: each queued operation first sleeps uniform [0, delay_us]
};
const Settings& settings();

/// Prints "shardkit sim: <what>" and aborts: a misuse the real CUDA/NCCL would answer with a crash or corruption.
[[noreturn]] void fatal(const std::string& what);

// ---- memory -----------------------------------------------------------------------------------------------------
enum class MemKind { kDevice, kManaged, kPinned };
struct Region {
  char* base = nullptr;  // the address handed out
  char* rw = nullptr;    // the address workers use (== base except for device memory)
  std::size_t size = 0;  // bytes asked for
  std::size_t mapped = 0;
  MemKind kind = MemKind::kDevice;
  int device = 0;
};
/// The region holding `p`, or false.
bool find_region(const void* p, Region* out);
void* allocate(std::size_t bytes, MemKind kind, int device);
/// Returns false when `p` is not the start of a region of `kind`.
bool release(void* p, MemKind kind);
/// Worker view of p (see sim.hpp).
void* rw(const void* p);

// ---- devices ----------------------------------------------------------------------------------------------------
int current_device();
void set_current_device(int d);
void set_last_error(cudaError_t e);
cudaError_t take_last_error();
cudaError_t peek_last_error();

// ---- streams and events -----------------------------------------------------------------------------------------
class Stream {
 public:
  Stream(int device, unsigned flags);
  int device() const { return device_; }
  /// Queues `op` after everything queued before (with the seeded random delay in front of it).
  void enqueue(std::function<void()> op);
  /// Blocks until everything queued so far has run.
  void synchronize();
  bool idle();
  /// Lets the worker finish its queue and exit; the stream object lives until then.
  void retire();
  /// The worker's loop (its thread is started by the stream table).
  void run();

 private:
  int device_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t queued_ = 0, done_ = 0;
  bool retired_ = false;
  std::uint64_t rng_;
};

/// The Stream behind a handle (nullptr and the legacy/per-thread handles mean the device's default stream).
/// Unknown handles are fatal.
std::shared_ptr<Stream> stream_of(cudaStream_t s);
/// Every live stream of `device` (-1: all devices), for cudaDeviceSynchronize and the implicit sync of cudaFree.
void synchronize_device(int device);

struct Event {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0, completed = 0;
};
std::shared_ptr<Event> event_of(cudaEvent_t e);

cudaStream_t create_stream(unsigned flags);
bool destroy_stream(cudaStream_t s);
cudaEvent_t create_event();
bool destroy_event(cudaEvent_t e);

}  // namespace shardkit::sim
