#include "shardkit/launch/config.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string_view>

#include "shardkit/core/error.hpp"

namespace shardkit {

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
std::atomic<bool> g_applied{false};  // the environment (or a set()) reached the collectives layer's defaults

void apply(const Config& config) {
  CommOptions::set_defaults(config.comm);
  ProcessSettings::set(config.process);
  g_applied.store(true, std::memory_order_release);
}

}  // namespace

Config Config::from_env() {
  Config c;
  if (auto v = env("SHARDKIT_BACKEND")) {
    const std::optional<BackendKind> kind = backend_from_name(*v);
    if (!kind) throw InvalidArgument(detail::concat("SHARDKIT_BACKEND='", *v, "': expected auto, mpi, nccl or shm"));
    c.comm.backend = *kind;
  }
  if (auto v = env("SHARDKIT_CHECK")) c.comm.check = parse_bool("SHARDKIT_CHECK", *v);
  if (auto v = env("SHARDKIT_VERBOSE")) c.comm.verbose = parse_bool("SHARDKIT_VERBOSE", *v);
  if (auto v = env("SHARDKIT_SHM_SINGLE_COPY")) c.comm.shm_single_copy = parse_bool("SHARDKIT_SHM_SINGLE_COPY", *v);
  if (auto v = env("SHARDKIT_TRACE_BUFFER"))
    c.comm.trace_buffer = parse_count("SHARDKIT_TRACE_BUFFER", *v, 1LL << 24, "operations");
  if (auto v = env("SHARDKIT_SHM_PENDING_BYTES"))
    c.comm.shm_pending_bytes = parse_count("SHARDKIT_SHM_PENDING_BYTES", *v, 1LL << 40, "bytes");
  if (auto v = env("SHARDKIT_TRACE")) {
    if (*v == "1" || *v == "true" || *v == "on" || *v == "yes")
      throw InvalidArgument(detail::concat("SHARDKIT_TRACE='", *v,
                                           "': expected the directory to write the traces to (0 or off: no trace)"));
    if (*v != "0" && *v != "off" && *v != "false" && *v != "no") c.process.trace_dir = std::string(*v);
  }
  if (auto v = env("SHARDKIT_HANDLE_SIGNALS")) c.process.handle_signals = parse_bool("SHARDKIT_HANDLE_SIGNALS", *v);
  if (auto v = env("SHARDKIT_TIMEOUT_S")) c.comm.timeout = parse_seconds("SHARDKIT_TIMEOUT_S", *v);
  if (auto v = env("SHARDKIT_HANG_WARN_S")) c.process.hang_warn = parse_seconds("SHARDKIT_HANG_WARN_S", *v);
  if (auto v = env("SHARDKIT_DUMP_WAIT_S")) c.process.dump_wait = parse_seconds("SHARDKIT_DUMP_WAIT_S", *v);
  if (auto v = env("SHARDKIT_DUMP_DIR")) c.process.dump_dir = std::string(*v);
  if (auto v = env("SHARDKIT_STAGING_POOL_MB"))
    c.process.staging_pool_bytes = parse_count("SHARDKIT_STAGING_POOL_MB", *v, 1LL << 30, "MiB") << 20;
  return c;
}

Config Config::get() {
  if (!g_applied.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_applied.load(std::memory_order_relaxed)) apply(from_env());
  }
  return {.comm = CommOptions::defaults(), .process = ProcessSettings::current()};
}

void Config::set(const Config& config) {
  std::lock_guard<std::mutex> lock(g_mu);
  apply(config);
}

}  // namespace shardkit
