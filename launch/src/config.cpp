#include "shardkit/launch/config.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "shardkit/core/error.hpp"

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

std::optional<std::string_view> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string_view(v);
}

bool parse_bool(const char* name, std::string_view v) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw InvalidArgument(detail::concat(name, "='", v, "': expected 1/0, true/false, on/off or yes/no"));
}

std::chrono::milliseconds parse_seconds(const char* name, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double seconds = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 1e9)
    throw InvalidArgument(detail::concat(name, "='", s, "': expected a non-negative number of seconds"));
  return std::chrono::milliseconds(static_cast<long long>(std::llround(seconds * 1000.0)));
}

std::size_t parse_count(const char* name, std::string_view v, long long most, const char* what) {
  const std::string s(v);
  char* end = nullptr;
  const long long n = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || n < 0 || n > most)
    throw InvalidArgument(detail::concat(name, "='", s, "': expected a number of ", what, " from 0 to ", most));
  return static_cast<std::size_t>(n);
}

std::mutex g_mu;
// Never freed, nor rewritten: a reference that get() returned stays valid and unchanged (other threads read through
// theirs, the watchdog's among them), and set() publishes a new one. The ones it replaced are kept here.
std::atomic<const Config*> g_config{nullptr};
std::vector<std::unique_ptr<const Config>>* g_replaced = new std::vector<std::unique_ptr<const Config>>;

}  // namespace

Config Config::from_env() {
  Config c;
  if (auto v = env("SHARDKIT_BACKEND")) {
    const std::optional<BackendKind> kind = backend_from_name(*v);
    if (!kind) throw InvalidArgument(detail::concat("SHARDKIT_BACKEND='", *v, "': expected auto, mpi, nccl or shm"));
    c.backend = *kind;
  }
  if (auto v = env("SHARDKIT_CHECK")) c.check = parse_bool("SHARDKIT_CHECK", *v);
  if (auto v = env("SHARDKIT_VERBOSE")) c.verbose = parse_bool("SHARDKIT_VERBOSE", *v);
  if (auto v = env("SHARDKIT_SHM_SINGLE_COPY")) c.shm_single_copy = parse_bool("SHARDKIT_SHM_SINGLE_COPY", *v);
  if (auto v = env("SHARDKIT_TRACE_BUFFER"))
    c.trace_buffer = parse_count("SHARDKIT_TRACE_BUFFER", *v, 1LL << 24, "operations");
  if (auto v = env("SHARDKIT_SHM_PENDING_BYTES"))
    c.shm_pending_bytes = parse_count("SHARDKIT_SHM_PENDING_BYTES", *v, 1LL << 40, "bytes");
  if (auto v = env("SHARDKIT_TRACE")) {
    if (*v == "1" || *v == "true" || *v == "on" || *v == "yes")
      throw InvalidArgument(detail::concat("SHARDKIT_TRACE='", *v,
                                           "': expected the directory to write the traces to (0 or off: no trace)"));
    if (*v != "0" && *v != "off" && *v != "false" && *v != "no") c.trace_dir = std::string(*v);
  }
  if (auto v = env("SHARDKIT_HANDLE_SIGNALS")) c.handle_signals = parse_bool("SHARDKIT_HANDLE_SIGNALS", *v);
  if (auto v = env("SHARDKIT_TIMEOUT_S")) c.timeout = parse_seconds("SHARDKIT_TIMEOUT_S", *v);
  if (auto v = env("SHARDKIT_HANG_WARN_S")) c.hang_warn = parse_seconds("SHARDKIT_HANG_WARN_S", *v);
  if (auto v = env("SHARDKIT_DUMP_WAIT_S")) c.dump_wait = parse_seconds("SHARDKIT_DUMP_WAIT_S", *v);
  if (auto v = env("SHARDKIT_DUMP_DIR")) c.dump_dir = std::string(*v);
  return c;
}

const Config& Config::get() {
  if (const Config* c = g_config.load(std::memory_order_acquire)) return *c;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_config.load(std::memory_order_relaxed)) g_config.store(new Config(from_env()), std::memory_order_release);
  return *g_config.load(std::memory_order_relaxed);
}

void Config::set(const Config& config) {
  auto next = std::make_unique<const Config>(config);
  std::lock_guard<std::mutex> lock(g_mu);
  if (const Config* old = g_config.exchange(next.release(), std::memory_order_acq_rel)) g_replaced->emplace_back(old);
}

}  // namespace shardkit
