#include "shardkit/collectives/options.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace shardkit {

const char* backend_name(BackendKind kind) noexcept {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kMpi: return "mpi";
    case BackendKind::kShm: return "shm";
    case BackendKind::kNccl: break;
  }
  return "nccl";
}

std::optional<BackendKind> backend_from_name(std::string_view name) noexcept {
  for (BackendKind k : {BackendKind::kAuto, BackendKind::kMpi, BackendKind::kNccl, BackendKind::kShm})
    if (name == backend_name(k)) return k;
  return std::nullopt;
}

namespace {

// A process-wide value that readers on any thread (the watchdog's among them) hold by reference: never freed nor
// rewritten; set() publishes a new one and keeps the one it replaced.
template <typename T>
class Published {
 public:
  explicit Published(T (*first)()) : first_(first) {}
  const T& get() {
    if (const T* v = current_.load(std::memory_order_acquire)) return *v;
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_.load(std::memory_order_relaxed)) current_.store(new T(first_()), std::memory_order_release);
    return *current_.load(std::memory_order_relaxed);
  }
  void set(const T& value) {
    auto next = std::make_unique<const T>(value);
    std::lock_guard<std::mutex> lock(mu_);
    if (const T* old = current_.exchange(next.release(), std::memory_order_acq_rel)) replaced_.emplace_back(old);
  }

 private:
  T (*first_)();
  std::mutex mu_;
  std::atomic<const T*> current_{nullptr};
  std::vector<std::unique_ptr<const T>> replaced_;
};

// Never destroyed: communicators and threads may read them during the process's exit.
Published<CommOptions>& comm_defaults() {
  static auto* p = new Published<CommOptions>(&CommOptions::builtin);
  return *p;
}

Published<ProcessSettings>& process_settings() {
  static auto* p = new Published<ProcessSettings>([] { return ProcessSettings{}; });
  return *p;
}

std::atomic<const JobInfo*> g_job{nullptr};

}  // namespace

CommOptions CommOptions::builtin() {
  // Every field is named: a field left out would take its default, defaults(), which starts from this.
  return {.backend = BackendKind::kAuto,
          .check = false,
          .timeout = std::chrono::milliseconds(0),
          .async = false,
          .name = "world",
          .max_message_elements = 2147483647,
          .verbose = false,
          .trace_buffer = 2000,
          .shm_single_copy = true,
          .shm_pending_bytes = std::size_t{8} << 20};
}

const CommOptions& CommOptions::defaults() { return comm_defaults().get(); }

void CommOptions::set_defaults(const CommOptions& options) {
  CommOptions d = options;
  d.name = "world";
  comm_defaults().set(d);
}

const ProcessSettings& ProcessSettings::current() { return process_settings().get(); }
void ProcessSettings::set(const ProcessSettings& settings) { process_settings().set(settings); }

const JobInfo* JobInfo::current() noexcept { return g_job.load(std::memory_order_acquire); }
void JobInfo::set_current(const JobInfo* job) noexcept { g_job.store(job, std::memory_order_release); }

}  // namespace shardkit
