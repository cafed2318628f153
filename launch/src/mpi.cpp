#include "shardkit/launch/mpi.hpp"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "shardkit/core/error.hpp"

namespace shardkit {

bool mpi_initialized() noexcept {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool mpi_finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<std::size_t>(len));
  if (auto nl = s.find_first_of("\r\n"); nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ' ' || s.back() == ',' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string mpi_vendor() {
  const std::string v = mpi_library_version();
  for (const char* name : {"Open MPI", "MPICH", "Intel(R) MPI", "MVAPICH", "Microsoft MPI"})
    if (v.find(name) != std::string::npos) return name;
  return v.substr(0, v.find(' '));
}

bool mpi_cuda_aware() noexcept {
  if (const char* env = std::getenv("SHARDKIT_MPI_CUDA_AWARE"); env && *env) return std::strcmp(env, "0") != 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() != 0;
#else
  return false;
#endif
}

MpiCommHandle mpi_comm_world() noexcept { return from_mpi(MPI_COMM_WORLD); }

// ---- MpiComm ---------------------------------------------------------------------------------------------------

void MpiComm::take(MpiCommHandle h) {
  handle_ = h;
  MPI_Comm c = to_mpi<MPI_Comm>(h);
  if (c == MPI_COMM_NULL) {
    rank_ = -1;
    size_ = 0;
    return;
  }
  SHARDKIT_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  SHARDKIT_MPI_CHECK(MPI_Comm_rank(c, &rank_));
  SHARDKIT_MPI_CHECK(MPI_Comm_size(c, &size_));
}

MpiComm MpiComm::dup(MpiCommHandle parent) {
  MPI_Comm out = MPI_COMM_NULL;
  SHARDKIT_MPI_CHECK(MPI_Comm_dup(to_mpi<MPI_Comm>(parent), &out));
  MpiComm c;
  c.take(from_mpi(out));
  return c;
}

MpiComm MpiComm::split(MpiCommHandle parent, int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  SHARDKIT_MPI_CHECK(MPI_Comm_split(to_mpi<MPI_Comm>(parent), color < 0 ? MPI_UNDEFINED : color, key, &out));
  MpiComm c;
  c.take(from_mpi(out));
  return c;
}

MpiComm MpiComm::adopt(MpiCommHandle comm) {
  MpiComm c;
  c.take(comm);
  return c;
}

MpiComm::~MpiComm() {
  if (rank_ < 0) return;
  if (mpi_finalized()) return;  // MPI tore everything down already; freeing now would be an error
  MPI_Comm c = to_mpi<MPI_Comm>(handle_);
  if (MPI_Comm_free(&c) != MPI_SUCCESS) std::fprintf(stderr, "shardkit: warning: MPI_Comm_free failed\n");
}

MpiComm::MpiComm(MpiComm&& o) noexcept : handle_(o.handle_), rank_(o.rank_), size_(o.size_) {
  o.rank_ = -1;
  o.size_ = 0;
}

MpiComm& MpiComm::operator=(MpiComm&& o) noexcept {
  if (this != &o) {
    MpiComm old(std::move(*this));
    handle_ = o.handle_;
    rank_ = o.rank_;
    size_ = o.size_;
    o.rank_ = -1;
    o.size_ = 0;
  }
  return *this;
}

namespace {
std::mutex g_abort_mu;
std::string g_abort_reason;
std::atomic<void (*)(const std::string&)> g_before_abort{nullptr};
std::atomic<void (*)() noexcept> g_before_finalize{nullptr};
}  // namespace

void request_abort_at_exit(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_abort_mu);
  if (g_abort_reason.empty()) g_abort_reason = reason.empty() ? "unspecified" : reason;
}

std::string abort_at_exit_reason() {
  std::lock_guard<std::mutex> lock(g_abort_mu);
  return g_abort_reason;
}

void set_before_abort(void (*fn)(const std::string& reason)) { g_before_abort.store(fn); }

void run_before_abort(const std::string& reason) noexcept {
  static std::atomic<bool> ran{false};
  if (auto* fn = g_before_abort.load(); fn && !ran.exchange(true)) {
    try {
      fn(reason);
    } catch (...) {
    }
  }
}

void set_before_finalize(void (*fn)() noexcept) { g_before_finalize.store(fn); }

void run_before_finalize() noexcept {
  if (auto* fn = g_before_finalize.load()) fn();
}

namespace detail {

void throw_mpi_error(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "unknown MPI error");
  int cls = code;
  MPI_Error_class(code, &cls);
  std::string hint;
  if (cls == MPI_ERR_TRUNCATE) {
    // A size mismatch that only the receiving rank sees: the others may carry on into a hang, so the job ends.
    hint = ". A rank sent more than this one expected: the ranks disagree on this operation. Rerun with "
           "SHARDKIT_CHECK=1 to have every rank name the mismatch; the job will end at exit";
    request_abort_at_exit("MPI reported a truncated message: the ranks disagree on an operation's size");
  }
  throw BackendError("MPI", code,
                     concat("MPI error ", code, " (class ", cls, ": ", text, ")", called_function(expr), hint),
                     source_location(expr, file, line));
}

namespace {

thread_local int t_world_errors_returned = 0;

void world_error(MPI_Comm* comm, int* code, ...) {
  if (t_world_errors_returned > 0) return;  // a shardkit wait: the code comes back to it
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(*code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "unknown MPI error");
  std::fprintf(stderr, "shardkit: MPI error on MPI_COMM_WORLD (fatal: MPI_ERRORS_ARE_FATAL): %s\n", text);
  std::fflush(stderr);
  MPI_Abort(*comm, *code);
}

}  // namespace

void install_world_error_handler() {
  MPI_Errhandler current = MPI_ERRHANDLER_NULL;
  SHARDKIT_MPI_CHECK(MPI_Comm_get_errhandler(MPI_COMM_WORLD, &current));
  const bool fatal = current == MPI_ERRORS_ARE_FATAL;
  MPI_Errhandler_free(&current);
  if (!fatal) return;  // the application's (or mpi4py's MPI_ERRORS_RETURN) stays
  MPI_Errhandler mine = MPI_ERRHANDLER_NULL;
  SHARDKIT_MPI_CHECK(MPI_Comm_create_errhandler(world_error, &mine));
  SHARDKIT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, mine));
  MPI_Errhandler_free(&mine);
}

WorldErrorsReturned::WorldErrorsReturned() noexcept { ++t_world_errors_returned; }
WorldErrorsReturned::~WorldErrorsReturned() { --t_world_errors_returned; }

}  // namespace detail
}  // namespace shardkit
