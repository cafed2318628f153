#include "output.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "shardkit/core/error.hpp"

namespace shardkit::bench {

using shardkit::detail::concat;

std::FILE* table_stream(const std::string& json) {
  return json == "-" ? stderr : stdout;
}

void write_json(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error(concat("cannot write ", path, ": ", std::strerror(errno)));
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error(concat("cannot write ", path));
}

std::string fmt(std::optional<double> v, const char* format) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, format, *v);
  return buf;
}

CommOptions fast_comm_options(bool check) {
  CommOptions o;
  // Host buffers, measured against MPI: the default route (shm where its table says, else MPI), or the backend
  // SHARDKIT_BACKEND forces (nccl means nothing for host buffers: MPI then).
  const BackendKind b = o.backend;  // SHARDKIT_BACKEND's, or auto
  o.backend = b == BackendKind::kNccl ? BackendKind::kMpi : b;
  o.check = check;
  o.timeout = std::chrono::milliseconds(0);
  o.async = false;
  o.name = "bench";
  return o;
}

}  // namespace shardkit::bench
